/*
 * The fastest closed-loop QoS 1 publisher we can write: the other half of make bench's broker
 * limit (devkit/bench/broker_limit.py builds it with the system cc, beside limit_sub.c).
 *
 *   limit_pub HOST PORT CLIENT_ID SENSORS DURATION_S BACKLOG STATUS_FILE OUT_JSON
 *
 * It offers the broker the load of the end-to-end bench's closed loop (devkit/bench/loadgen.py,
 * mode closedloop) at C speed: MQTT 3.1.1 (as the load generator), SENSORS sensors publishing
 * one reading each per round on sensors/node-<i>/raw, the same payload
 * ({"ts":<unix s>,"pm10":<value>}, QoS 1), 500 PUBLISH packets per write, never more than BACKLOG
 * messages ahead of the consumer's count in STATUS_FILE ({"updated_at": s, "readings_in": N}, as
 * the daemon's status.json and limit_sub's), ending at the end of the first round after
 * DURATION_S. PUBACKs are read without blocking between writes; at most 30,000 messages are
 * unacknowledged, so no packet id is reused in flight. OUT_JSON gets the samples
 * [[updated_at, published, consumed], ...] and "readings_published", the load generator's own
 * output format. The Python generator costs about 3 us per message on the core it shares with
 * the broker; this one a fraction of that, so the broker gets that core. Exits 2 with a message
 * on stderr on any failure.
 */
#include <time.h>

#include "limit_io.h"

#define CHUNK 500
#define MAX_UNACKED 30000
#define MAX_SAMPLES 200000
#define PACKET_MAX 128

static double monotonic_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_s(double seconds) {
    struct timespec t = {0, (long)(seconds * 1e9)};
    nanosleep(&t, NULL);
}

/* The consumer's status: 1 and its fields when readable and whole, else 0. */
static int read_status(const char *path, double *updated_at, long long *consumed) {
    char text[512];
    FILE *in = fopen(path, "r");
    if (in == NULL) return 0;
    size_t n = fread(text, 1, sizeof text - 1, in);
    fclose(in);
    text[n] = 0;
    const char *at = strstr(text, "\"updated_at\":"), *count = strstr(text, "\"readings_in\":");
    if (at == NULL || count == NULL) return 0;
    *updated_at = strtod(at + 13, NULL);
    *consumed = strtoll(count + 14, NULL, 10);
    return 1;
}

/* PUBACKs waiting on the socket (4 bytes each under MQTT 3.1.1), counted without blocking
 * unless `block`; a partial PUBACK stays in `pending`. */
static long long read_acks(int fd, int block, uint8_t *pending, size_t *have) {
    static uint8_t buf[1 << 16];
    long long acks = 0;
    ssize_t got = recv(fd, buf, sizeof buf, block ? 0 : MSG_DONTWAIT);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        fail("read");
    }
    if (got == 0) {
        errno = 0;
        fail("the broker closed the connection");
    }
    for (ssize_t i = 0; i < got; i++) {
        pending[(*have)++] = buf[i];
        if (*have == 4) {
            errno = 0;
            if (pending[0] != 0x40 || pending[1] != 0x02) fail("unexpected packet (not a PUBACK)");
            acks++;
            *have = 0;
        }
    }
    return acks;
}

/* What the closed loop knows of its consumer, and the samples it writes out. */
struct loop_state {
    const char *status;
    double last_at;
    long long consumed0, consumed, published;
    double (*samples)[3];
    size_t sample_count;
};

/* Reads the consumer's status; a new one updates `consumed` and adds a sample. */
static void poll_status(struct loop_state *loop) {
    double at;
    long long count;
    if (!read_status(loop->status, &at, &count) || at == loop->last_at) return;
    loop->last_at = at;
    loop->consumed = count - loop->consumed0;
    if (loop->sample_count < MAX_SAMPLES) {
        double *sample = loop->samples[loop->sample_count++];
        sample[0] = at;
        sample[1] = (double)loop->published;
        sample[2] = (double)loop->consumed;
    }
}

int main(int argc, char **argv) {
    limit_program = "limit_pub";
    if (argc != 9) {
        fprintf(stderr, "usage: limit_pub HOST PORT CLIENT_ID SENSORS DURATION_S BACKLOG "
                        "STATUS_FILE OUT_JSON\n");
        return 2;
    }
    const char *host = argv[1], *port = argv[2], *client_id = argv[3];
    long sensors = atol(argv[4]);
    double duration = atof(argv[5]);
    long long backlog = atoll(argv[6]);
    const char *status = argv[7], *out_path = argv[8];
    errno = 0;
    if (sensors < 1 || sensors > 99999 || duration <= 0 || backlog < 1) fail("bad arguments");

    int fd = connect_to(host, port);

    /* CONNECT: "MQTT" level 4, clean session, no keep-alive (as devkit/bench/mqtt_wire.py). */
    uint8_t connect_packet[64];
    size_t id_length = strlen(client_id), n = 0;
    errno = 0;
    if (id_length > 40) fail("client id too long");
    connect_packet[n++] = 0x10;
    connect_packet[n++] = (uint8_t)(10 + 2 + id_length);
    memcpy(connect_packet + n, "\x00\x04MQTT\x04\x02\x00\x00", 10);
    n += 10;
    connect_packet[n++] = 0;
    connect_packet[n++] = (uint8_t)id_length;
    memcpy(connect_packet + n, client_id, id_length);
    write_all(fd, connect_packet, n + id_length);
    uint8_t connack[4];
    size_t got_connack = 0;
    while (got_connack < 4) {
        ssize_t got = read(fd, connack + got_connack, 4 - got_connack);
        if (got <= 0) fail("no CONNACK");
        got_connack += (size_t)got;
    }
    errno = 0;
    if (connack[0] != 0x20 || connack[3] != 0) fail("CONNACK refused");

    /* Per sensor: a level (2-50 ug/m3, fixed by its index) and its topic. */
    double *level = malloc((size_t)sensors * sizeof *level);
    uint8_t *packets = malloc((size_t)CHUNK * PACKET_MAX);
    double (*samples)[3] = malloc(MAX_SAMPLES * sizeof *samples);
    if (level == NULL || packets == NULL || samples == NULL) fail("out of memory");
    for (long i = 0; i < sensors; i++) level[i] = 2.0 + (double)((i * 7919) % 4801) / 100.0;

    struct loop_state loop = {.status = status, .samples = samples};
    if (!read_status(status, &loop.last_at, &loop.consumed0))
        fail("the consumer's status file is not readable");
    long long acked = 0;
    uint8_t pending[4];
    size_t pending_have = 0;
    unsigned packet_id = 0;
    long long ts0 = (long long)time(NULL) - 86400;
    double end = monotonic_s() + duration, status_read = 0.0;

    for (long long round = 0;; round++) {
        for (long start = 0; start < sensors; start += CHUNK) {
            long stop = start + CHUNK < sensors ? start + CHUNK : sensors;
            while (loop.published - loop.consumed > backlog) {
                sleep_s(0.002);
                poll_status(&loop);
                acked += read_acks(fd, 0, pending, &pending_have);
            }
            while (loop.published + (stop - start) - acked > MAX_UNACKED)
                acked += read_acks(fd, 1, pending, &pending_have);
            size_t size = 0;
            for (long i = start; i < stop; i++) {
                char topic[32], payload[64];
                int topic_length = snprintf(topic, sizeof topic, "sensors/node-%05ld/raw", i);
                double value = level[i] * (0.9 + 0.2 * (double)((i * 31 + round) % 101) / 100.0);
                int payload_length =
                    snprintf(payload, sizeof payload, "{\"ts\":%lld,\"pm10\":%.1f}", ts0 + round, value);
                packet_id = packet_id % 65535 + 1;
                size_t remaining = 2 + (size_t)topic_length + 2 + (size_t)payload_length;
                errno = 0;
                if (remaining > 127) fail("a PUBLISH longer than one length byte holds");
                uint8_t *p = packets + size;
                *p++ = 0x32; /* PUBLISH, QoS 1 */
                *p++ = (uint8_t)remaining;
                *p++ = 0;
                *p++ = (uint8_t)topic_length;
                memcpy(p, topic, (size_t)topic_length);
                p += topic_length;
                *p++ = (uint8_t)(packet_id >> 8);
                *p++ = (uint8_t)(packet_id & 0xff);
                memcpy(p, payload, (size_t)payload_length);
                p += payload_length;
                size = (size_t)(p - packets);
            }
            write_all(fd, packets, size);
            loop.published += stop - start;
            acked += read_acks(fd, 0, pending, &pending_have);
            if (monotonic_s() - status_read > 0.01) {
                status_read = monotonic_s();
                poll_status(&loop);
            }
        }
        if (monotonic_s() >= end) break;
    }
    double deadline = monotonic_s() + 30.0;
    while (acked < loop.published) {
        errno = 0;
        if (monotonic_s() > deadline) fail("PUBACKs still missing 30 s after the last publish");
        acked += read_acks(fd, 1, pending, &pending_have);
    }
    uint8_t disconnect[2] = {0xe0, 0x00};
    write_all(fd, disconnect, 2);
    close(fd);

    FILE *out = fopen(out_path, "w");
    if (out == NULL) fail("cannot write the output file");
    fprintf(out, "{\"readings_published\": %lld, \"samples\": [", loop.published);
    for (size_t i = 0; i < loop.sample_count; i++)
        fprintf(out, "%s[%.6f, %.0f, %.0f]", i ? ", " : "", samples[i][0], samples[i][1],
                samples[i][2]);
    fprintf(out, "]}\n");
    if (fclose(out) != 0) fail("cannot write the output file");
    return 0;
}
