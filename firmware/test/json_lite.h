// A minimal JSON reader for the shared test vectors (objects, arrays, strings without
// escapes beyond \" \\ \/ \n \t, integers, booleans, null). Test code only, host only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace json {

struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Value> items;
  std::map<std::string, Value> members;

  const Value& operator[](const std::string& key) const {
    auto it = members.find(key);
    if (it == members.end()) throw std::runtime_error("missing key " + key);
    return it->second;
  }
  bool has(const std::string& key) const { return members.count(key) != 0; }
  bool is_null() const { return kind == Kind::kNull; }
  int64_t integer() const { return static_cast<int64_t>(number); }
};

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}
  Value parse() {
    Value v = value();
    space();
    if (i_ != s_.size()) fail("trailing data");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) {
    throw std::runtime_error(std::string("json: ") + what + " at " + std::to_string(i_));
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool take(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }
  std::string string() {
    if (s_[i_] != '"') fail("expected string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        char e = s_[i_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'u': {
            unsigned code = std::stoul(s_.substr(i_, 4), nullptr, 16);
            i_ += 4;
            if (code < 0x80) {
              out += char(code);
            } else if (code < 0x800) {
              out += char(0xC0 | (code >> 6));
              out += char(0x80 | (code & 0x3F));
            } else {
              out += char(0xE0 | (code >> 12));
              out += char(0x80 | ((code >> 6) & 0x3F));
              out += char(0x80 | (code & 0x3F));
            }
            break;
          }
          default: fail("unsupported escape");
        }
      } else {
        out += c;
      }
    }
    ++i_;
    return out;
  }
  Value value() {
    space();
    Value v;
    if (i_ >= s_.size()) fail("unexpected end");
    char c = s_[i_];
    if (c == '{') {
      v.kind = Value::Kind::kObject;
      ++i_;
      space();
      if (s_[i_] == '}') { ++i_; return v; }
      while (true) {
        space();
        std::string key = string();
        space();
        if (s_[i_++] != ':') fail("expected ':'");
        v.members[key] = value();
        space();
        if (s_[i_] == ',') { ++i_; continue; }
        if (s_[i_] == '}') { ++i_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::kArray;
      ++i_;
      space();
      if (s_[i_] == ']') { ++i_; return v; }
      while (true) {
        v.items.push_back(value());
        space();
        if (s_[i_] == ',') { ++i_; continue; }
        if (s_[i_] == ']') { ++i_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::kString;
      v.text = string();
      return v;
    }
    if (take("true")) { v.kind = Value::Kind::kBool; v.boolean = true; return v; }
    if (take("false")) { v.kind = Value::Kind::kBool; return v; }
    if (take("null")) return v;
    size_t end = i_;
    while (end < s_.size() && std::string("+-0123456789.eE").find(s_[end]) != std::string::npos) ++end;
    if (end == i_) fail("unexpected character");
    v.kind = Value::Kind::kNumber;
    v.number = std::strtod(s_.substr(i_, end - i_).c_str(), nullptr);
    i_ = end;
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace json
