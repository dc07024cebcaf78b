/*
 * What limit_pub.c and limit_sub.c share: failing with a message, whole writes, and a TCP
 * connection to the broker with Nagle's algorithm off (as the gateway and the bench connect).
 * Each program sets limit_program to its name before anything can fail.
 */
#ifndef LIMIT_IO_H
#define LIMIT_IO_H

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *limit_program = "limit";

static void fail(const char *what) {
    fprintf(stderr, "%s: %s%s%s\n", limit_program, what, errno ? ": " : "",
            errno ? strerror(errno) : "");
    exit(2);
}

static void write_all(int fd, const uint8_t *data, size_t size) {
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("write");
        }
        data += n;
        size -= (size_t)n;
    }
}

static int connect_to(const char *host, const char *port) {
    struct addrinfo hints = {0}, *address = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &address) != 0 || address == NULL) fail("resolve");
    int fd = socket(address->ai_family, address->ai_socktype, address->ai_protocol);
    if (fd < 0 || connect(fd, address->ai_addr, address->ai_addrlen) != 0) fail("connect");
    freeaddrinfo(address);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

#endif
