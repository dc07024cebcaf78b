/*
 * The fastest QoS 1 subscriber we can write: the yardstick of make bench's broker limit
 * (devkit/bench/broker_limit.py builds it with the system cc and runs it).
 *
 *   limit_sub HOST PORT CLIENT_ID TOPIC COUNT [STATUS_FILE]
 *
 * MQTT 5 over a plain socket, as the daemon connects (no Receive Maximum sent: 65,535, so the
 * broker's in-flight window to it is the daemon's, not max_inflight_messages' 1,000): CONNECT
 * (clean start), SUBSCRIBE TOPIC at QoS 1, prints
 * "subscribed" once the SUBACK grants QoS 1, then reads the socket in 1 MiB chunks, parses every
 * PUBLISH in a chunk and writes the PUBACKs of the whole chunk in one write. libmosquitto's
 * mosquitto_sub acknowledges each message with a write of its own, which made it slower than the
 * daemon it was meant to bound. With STATUS_FILE it also writes, at most every 10 ms, the
 * count so far as the daemon's status.json does ({"updated_at": <unix s>, "readings_in": N},
 * replaced atomically), so the end-to-end bench's closed-loop load generator can drive it exactly
 * as it drives the daemon. Exits 0 after COUNT messages (all acknowledged), printing
 * "received N"; any protocol surprise exits 2 with a message on stderr.
 */
#include <time.h>

#include "limit_io.h"

#define READ_CHUNK (1 << 20)

static size_t put_string(uint8_t *out, const char *text) {
    size_t n = strlen(text);
    out[0] = (uint8_t)(n >> 8);
    out[1] = (uint8_t)(n & 0xff);
    memcpy(out + 2, text, n);
    return n + 2;
}

static size_t put_length(uint8_t *out, size_t length) {
    size_t i = 0;
    do {
        uint8_t byte = length % 128;
        length /= 128;
        out[i++] = byte | (length ? 0x80 : 0);
    } while (length);
    return i;
}

/* One whole packet at buf[0..have): its header byte, body offset and body length; 0 if more
 * bytes are needed. */
static int packet_at(const uint8_t *buf, size_t have, uint8_t *header, size_t *body,
                     size_t *length) {
    size_t value = 0, multiplier = 1, i = 1;
    if (have < 2) return 0;
    for (;;) {
        if (i >= have) return 0;
        if (i > 4) {
            errno = 0;
            fail("malformed remaining length");
        }
        uint8_t byte = buf[i++];
        value += (size_t)(byte & 0x7f) * multiplier;
        multiplier *= 128;
        if (!(byte & 0x80)) break;
    }
    if (have < i + value) return 0;
    *header = buf[0];
    *body = i;
    *length = value;
    return 1;
}

/* Reads until one whole packet is at the front of buf; returns its total size. */
static size_t read_packet(int fd, uint8_t *buf, size_t cap, size_t *have, uint8_t *header,
                          size_t *body, size_t *length) {
    while (!packet_at(buf, *have, header, body, length)) {
        ssize_t n = read(fd, buf + *have, cap - *have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("connection closed during the handshake");
        *have += (size_t)n;
    }
    return *body + *length;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void write_status(const char *path, long long received) {
    char partial[4096];
    snprintf(partial, sizeof partial, "%s.partial", path);
    FILE *out = fopen(partial, "w");
    if (out == NULL) fail("cannot write the status file");
    fprintf(out, "{\"updated_at\": %.6f, \"readings_in\": %lld}\n", now_s(), received);
    if (fclose(out) != 0 || rename(partial, path) != 0) fail("cannot replace the status file");
}

static void consume(uint8_t *buf, size_t *have, size_t used) {
    memmove(buf, buf + used, *have - used);
    *have -= used;
}

int main(int argc, char **argv) {
    limit_program = "limit_sub";
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: limit_sub HOST PORT CLIENT_ID TOPIC COUNT [STATUS_FILE]\n");
        return 2;
    }
    const char *host = argv[1], *port = argv[2], *client_id = argv[3], *topic = argv[4];
    long long wanted = atoll(argv[5]);
    const char *status = argc == 7 ? argv[6] : NULL;

    int fd = connect_to(host, port);

    uint8_t *buf = malloc(READ_CHUNK + 16);
    uint8_t *acks = malloc(READ_CHUNK); /* a PUBLISH is >= 4 bytes, a PUBACK 4 */
    if (buf == NULL || acks == NULL) fail("out of memory");
    uint8_t packet[1024], variable[1024];
    size_t have = 0, body, length, n;
    uint8_t header;

    /* CONNECT: protocol "MQTT" level 5, clean start, keep-alive 600 s, no properties. */
    n = put_string(variable, "MQTT");
    variable[n++] = 5;
    variable[n++] = 0x02;
    variable[n++] = 600 >> 8;
    variable[n++] = 600 & 0xff;
    variable[n++] = 0; /* properties length */
    n += put_string(variable + n, client_id);
    packet[0] = 0x10;
    size_t size = 1 + put_length(packet + 1, n);
    memcpy(packet + size, variable, n);
    write_all(fd, packet, size + n);
    size = read_packet(fd, buf, READ_CHUNK, &have, &header, &body, &length);
    errno = 0;
    if (header != 0x20 || length < 3 || buf[body + 1] != 0) fail("CONNACK refused");
    consume(buf, &have, size);

    /* SUBSCRIBE (packet id 1, no properties) TOPIC at QoS 1. */
    variable[0] = 0;
    variable[1] = 1;
    variable[2] = 0; /* properties length */
    n = 3 + put_string(variable + 3, topic);
    variable[n++] = 1;
    packet[0] = 0x82;
    size = 1 + put_length(packet + 1, n);
    memcpy(packet + size, variable, n);
    write_all(fd, packet, size + n);
    size = read_packet(fd, buf, READ_CHUNK, &have, &header, &body, &length);
    errno = 0;
    /* SUBACK: packet id, properties (length < 128 from mosquitto), one reason code. */
    if (header != 0x90 || length < 4 || buf[body + 2] > 127 ||
        buf[body + 3 + buf[body + 2]] != 1)
        fail("SUBACK did not grant QoS 1");
    consume(buf, &have, size);
    if (status != NULL) write_status(status, 0);
    printf("subscribed\n");
    fflush(stdout);

    long long received = 0;
    double written_at = now_s();
    while (received < wanted) {
        ssize_t got = read(fd, buf + have, READ_CHUNK - have);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) fail("connection closed before every message arrived");
        have += (size_t)got;
        size_t at = 0, queued = 0;
        errno = 0;
        if (have == READ_CHUNK && !packet_at(buf, have, &header, &body, &length))
            fail("a packet larger than the read buffer");
        while (packet_at(buf + at, have - at, &header, &body, &length)) {
            const uint8_t *p = buf + at + body;
            errno = 0;
            if ((header & 0xf0) == 0x30) {
                int qos = (header >> 1) & 3;
                if (qos != 1 || length < 4) fail("a PUBLISH not at QoS 1");
                size_t topic_length = ((size_t)p[0] << 8) | p[1];
                if (topic_length + 4 > length) fail("malformed PUBLISH");
                /* MQTT 5: a PUBACK of the packet id alone means success. */
                acks[queued++] = 0x40;
                acks[queued++] = 0x02;
                acks[queued++] = p[2 + topic_length];
                acks[queued++] = p[3 + topic_length];
                received++;
            } else if (header != 0xd0) { /* anything but a PINGRESP is unexpected here */
                fail("unexpected packet");
            }
            at += body + length;
        }
        if (queued) write_all(fd, acks, queued);
        consume(buf, &have, at);
        if (status != NULL && now_s() - written_at >= 0.01) {
            write_status(status, received);
            written_at = now_s();
        }
    }
    uint8_t disconnect[2] = {0xe0, 0x00};
    write_all(fd, disconnect, 2);
    close(fd);
    printf("received %lld\n", received);
    return 0;
}
