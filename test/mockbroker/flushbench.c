/*
 * flushbench: times one rd_kafka_flush of N messages (idempotent producer,
 * acks=all, linger.ms=0) against a mockbroker process at RTT 0, once with
 * the TCP_NODELAY fix and once without (--no-nodelay), and prints both.
 * A benchmark for the record, not an assertion.
 *
 * Usage: flushbench [--mockbroker PATH] [--messages N] [--runs R]
 *                   [--partitions P]
 */
#define _GNU_SOURCE /* pipe2 */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#define REPLY_TIMEOUT_MS 10000
#define FLUSH_TIMEOUT_MS 30000

struct mock {
    pid_t pid;
    int to_fd;   /* its stdin */
    int from_fd; /* its stdout */
    char buf[4096];
    size_t len;
};

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Reads one line from the mock into out (without the newline), waiting at
 * most timeout_ms in total. */
static bool mock_read_line(struct mock *m, char *out, size_t outsz,
                           int timeout_ms)
{
    double deadline = now_ms() + timeout_ms;

    for (;;) {
        char *nl = memchr(m->buf, '\n', m->len);
        struct pollfd pfd = {.fd = m->from_fd, .events = POLLIN};
        double left;
        ssize_t n;

        if (nl) {
            size_t l = (size_t)(nl - m->buf);

            if (l >= outsz)
                l = outsz - 1;
            memcpy(out, m->buf, l);
            out[l] = '\0';
            m->len -= (size_t)(nl + 1 - m->buf);
            memmove(m->buf, nl + 1, m->len);
            return true;
        }
        if (m->len == sizeof m->buf)
            return false;
        left = deadline - now_ms();
        if (left <= 0)
            return false;
        if (poll(&pfd, 1, (int)left + 1) < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        if (!(pfd.revents & (POLLIN | POLLHUP)))
            continue;
        n = read(m->from_fd, m->buf + m->len, sizeof m->buf - m->len);
        if (n <= 0)
            return false; /* EOF: the mock died */
        m->len += (size_t)n;
    }
}

/* Sends a command and returns its reply line in out; false unless "OK...". */
static bool mock_command(struct mock *m, const char *cmd, char *out,
                         size_t outsz)
{
    size_t l = strlen(cmd);

    if (write(m->to_fd, cmd, l) != (ssize_t)l || write(m->to_fd, "\n", 1) != 1)
        return false;
    return mock_read_line(m, out, outsz, REPLY_TIMEOUT_MS) &&
           strncmp(out, "OK", 2) == 0;
}

static bool mock_start(struct mock *m, const char *path, bool nodelay,
                       int partitions, char *bootstrap, size_t bsz)
{
    int in[2], out[2];
    char topic[64], line[1024];

    snprintf(topic, sizeof topic, "bench:%d", partitions);
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        return false;
    m->len = 0;
    m->pid = fork();
    if (m->pid < 0)
        return false;
    if (m->pid == 0) {
        char *argv[] = {(char *)path, "--brokers", "3", "--topic", topic,
                        nodelay ? NULL : "--no-nodelay", NULL};

        dup2(in[0], STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        execv(path, argv);
        perror(path);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    m->to_fd = in[1];
    m->from_fd = out[0];
    if (!mock_read_line(m, line, sizeof line, REPLY_TIMEOUT_MS) ||
        strncmp(line, "BOOTSTRAP ", 10) != 0)
        return false;
    snprintf(bootstrap, bsz, "%s", line + 10);
    return true;
}

/* Asks the mock to quit and reaps it; kills it if it does not exit in time.
 * Its stdout reaching EOF is the sign that it has exited. */
static void mock_stop(struct mock *m)
{
    char line[256];
    double deadline = now_ms() + REPLY_TIMEOUT_MS, left;
    int status;

    mock_command(m, "quit", line, sizeof line);
    close(m->to_fd);
    while ((left = deadline - now_ms()) > 0) {
        struct pollfd pfd = {.fd = m->from_fd, .events = POLLIN};

        if (poll(&pfd, 1, (int)left + 1) > 0 &&
            read(m->from_fd, line, sizeof line) <= 0)
            break;
    }
    if (left <= 0)
        kill(m->pid, SIGKILL);
    waitpid(m->pid, &status, 0);
    close(m->from_fd);
}

static int dr_errors;

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (msg->err)
        dr_errors++;
}

static rd_kafka_t *producer_new(const char *bootstrap)
{
    static const char *props[][2] = {
        {"enable.idempotence", "true"},
        {"acks", "all"},
        {"linger.ms", "0"},
    };
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char errstr[512];
    rd_kafka_t *rk;

    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr,
                          sizeof errstr) != RD_KAFKA_CONF_OK)
        goto fail;
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++)
        if (rd_kafka_conf_set(conf, props[i][0], props[i][1], errstr,
                              sizeof errstr) != RD_KAFKA_CONF_OK)
            goto fail;
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    if ((rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr)))
        return rk;
fail:
    fprintf(stderr, "flushbench: %s\n", errstr);
    rd_kafka_conf_destroy(conf);
    return NULL;
}

/* Produces n keyed messages and flushes; returns elapsed ms or -1. */
static double timed_flush(rd_kafka_t *rk, int n)
{
    static const char value[100] = "payload";
    double t0 = now_ms();

    dr_errors = 0;
    for (int i = 0; i < n; i++) {
        char key[16];
        rd_kafka_resp_err_t err;

        snprintf(key, sizeof key, "k%d", i);
        err = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("bench"),
                                RD_KAFKA_V_KEY(key, strlen(key)),
                                RD_KAFKA_V_VALUE((void *)value, sizeof value),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_END);
        if (err) {
            fprintf(stderr, "flushbench: produce: %s\n", rd_kafka_err2str(err));
            return -1;
        }
    }
    if (rd_kafka_flush(rk, FLUSH_TIMEOUT_MS) || dr_errors) {
        fprintf(stderr, "flushbench: flush failed (%d delivery errors)\n",
                dr_errors);
        return -1;
    }
    return now_ms() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Median flush time over runs, after one untimed warm-up flush that pays
 * for connections, metadata and the producer id. */
static double bench(const char *path, bool nodelay, int messages, int runs,
                    int partitions)
{
    struct mock m;
    char bootstrap[1024], stats[256] = "";
    double *t = calloc((size_t)runs, sizeof *t), result = -1;
    rd_kafka_t *rk = NULL;

    if (!t || !mock_start(&m, path, nodelay, partitions, bootstrap,
                          sizeof bootstrap)) {
        fprintf(stderr, "flushbench: cannot start %s\n", path);
        free(t);
        return -1;
    }
    if (!(rk = producer_new(bootstrap)) || timed_flush(rk, messages) < 0)
        goto out;
    for (int i = 0; i < runs; i++)
        if ((t[i] = timed_flush(rk, messages)) < 0)
            goto out;
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    result = t[runs / 2];
    mock_command(&m, "stats", stats, sizeof stats);
    fprintf(stderr, "%-7s: median %.1f ms, min %.1f, max %.1f over %d flushes"
                    " (3 brokers, %d partitions); mock %s\n",
            nodelay ? "nodelay" : "stock", result, t[0], t[runs - 1], runs,
            partitions, strncmp(stats, "OK ", 3) == 0 ? stats + 3 : stats);
out:
    if (rk)
        rd_kafka_destroy(rk);
    mock_stop(&m);
    free(t);
    return result;
}

int main(int argc, char **argv)
{
    const char *path = "./mockbroker";
    /* Several partitions per broker so a flush pipelines several Produce
     * requests to one broker, as the relay's does: with one partition all
     * 200 messages fit one request and Nagle has nothing to hold back. */
    int messages = 200, runs = 9, partitions = 8;
    double fast, slow;

    for (int i = 1; i < argc; i += 2) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;

        if (val && strcmp(argv[i], "--mockbroker") == 0)
            path = val;
        else if (val && strcmp(argv[i], "--messages") == 0)
            messages = atoi(val);
        else if (val && strcmp(argv[i], "--runs") == 0)
            runs = atoi(val);
        else if (val && strcmp(argv[i], "--partitions") == 0)
            partitions = atoi(val);
        else
            messages = 0; /* -> usage */
    }
    if (messages < 1 || runs < 1 || partitions < 1) {
        fprintf(stderr, "usage: flushbench [--mockbroker PATH] [--messages N]"
                        " [--runs R] [--partitions P]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a dead mock must fail a write, not kill us */

    fast = bench(path, true, messages, runs, partitions);
    slow = bench(path, false, messages, runs, partitions);
    if (fast < 0 || slow < 0)
        return 1;
    printf("flush of %d messages at rtt 0: %.1f ms (nodelay) vs %.1f ms "
           "(stock)\n",
           messages, fast, slow);
    return 0;
}
