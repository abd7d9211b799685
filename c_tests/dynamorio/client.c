/* A DynamoRIO client that drives every drpttracer.h function from DynamoRIO's own events
 * (the way drmemtrace's -enable_kernel_tracing does) and checks each return code against
 * what DynamoRIO's ext/drpttracer/drpttracer.c returns for the same call:
 *
 *   dr_client_main   drpttracer_init (twice: reference counted) [+ one drpttracer_exit]
 *   thread init      drpttracer_create_output (kept for the thread, and a second one with a
 *                    sideband buffer, destroyed at once) + the bad-parameter calls below
 *   pre-syscall      drpttracer_create_handle (kernel only) + drpttracer_start_tracing
 *   post-syscall     drpttracer_stop_tracing + drpttracer_get_pt_metadata +
 *                    drpttracer_destroy_handle
 *   thread exit      drpttracer_destroy_output (and stop/destroy of a handle left open by a
 *                    syscall that never returns: SYS_exit)
 *   process exit     drpttracer_exit (only when init succeeded: a failed init of
 *                    DynamoRIO's library already dropped its own reference)
 *
 * Expected return codes (DynamoRIO 05e31650, ext/drpttracer/drpttracer.c):
 *   init                         true with an intel_pt PMU (it reads
 *                                /sys/devices/intel_pt/{type,format/...}), false without;
 *                                a second init returns true when the first did
 *   create_output(NULL out)      ERROR_INVALID_PARAMETER
 *   create_output(pt shift 0)    ERROR_INVALID_PARAMETER
 *   create_output(valid)         SUCCESS, with or without init: pt_buffer of 2^shift pages,
 *                                pt_size 0, sideband_size 0; sd shift 0 -> sideband NULL/0,
 *                                else (2^sd + 1) pages
 *   destroy_output(NULL)         ERROR_INVALID_PARAMETER; (valid) SUCCESS
 *   create_handle(NULL out)      ERROR_INVALID_PARAMETER (checked first)
 *   create_handle(pt or sideband shift 0)  ERROR_INVALID_PARAMETER
 *   create_handle(mode 7)        ERROR_INVALID_PARAMETER (before any perf_event_open)
 *   create_handle(valid)         SUCCESS, or ERROR_FAILED_TO_OPEN_PERF_EVENT when the event
 *                                cannot be opened (option expect_handle)
 *   destroy_handle(NULL)         ERROR_INVALID_PARAMETER; (valid) SUCCESS
 *   start_tracing(NULL)          ERROR_INVALID_PARAMETER; (valid) SUCCESS
 *   stop_tracing(NULL handle)    ERROR_INVALID_PARAMETER
 *   stop_tracing(handle, NULL)   ERROR_INVALID_PARAMETER; (valid) SUCCESS, kernel-only
 *                                mode -> sideband_size 0, pt_size <= pt_buffer_size
 *   get_pt_metadata(NULL, md)    ERROR_INVALID_PARAMETER
 *   get_pt_metadata(h, NULL)     ERROR_INVALID_PARAMETER; (valid) SUCCESS
 * The calls that need a handle from a successful init are skipped when init failed (what
 * DynamoRIO's library would do with them is undefined: it never filled its perf attrs).
 *
 * Leak check over many thread lifetimes: the number of open fds (/proc/self/fd) and VmRSS
 * (/proc/self/status; the client writes every page of each thread's output, so a leaked
 * output stays resident) are sampled after the Nth thread exit (option sample_at, default
 * 100) and at process exit; leak=yes when fds grew by more than fd_slack (default 2) or
 * VmRSS by more than rss_slack_kb (default 16384); live outputs/handles (created minus
 * destroyed) must be 0 at exit. DynamoRIO calls every thread's exit event before the
 * process exit event, so all outputs are destroyed by then.
 *
 * Options (after -c client.so): expect_init=0|1 (default 0: no Intel PT here),
 * expect_handle=SUCCESS|ERROR_FAILED_TO_OPEN_PERF_EVENT|...|fail (fail: any status but
 * SUCCESS; default SUCCESS), sample_at=N, fd_slack=N, rss_slack_kb=N.
 *
 * Output: one line at process exit on stderr,
 *   drpttracer-client: threads=N calls=N mismatches=N init=0|1 handles_ok=N
 *   handles_failed=N outputs_live=N handles_live=N fds@N=A fds@exit=B rss@N=AkB
 *   rss@exit=BkB leak=no|yes
 * (one line), mismatch details before it (the first 20); the process exits with status
 * 3 (dr_abort_with_code) when mismatches > 0 or leak=yes.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dr_api.h"
#include "drmgr.h"
#include "drpttracer.h"

/* Our library's extension; weak so that the same client also runs on DynamoRIO's own
 * libdrpttracer.so (where it is absent) to confirm the expectations above. */
#pragma weak drpttracer_ext_last_error

#define PT_SHIFT 4 /* 16 pages */
#define SD_SHIFT 1 /* (2 + 1) pages */
#define BAD_MODE ((drpttracer_tracing_mode_t)7)
#define EXPECT_ANY_FAILURE (-1)
#define MAX_REPORTED_MISMATCHES 20

static const char *const status_names[] = {
    "SUCCESS",
    "ERROR",
    "ERROR_INVALID_PARAMETER",
    "ERROR_FAILED_TO_OPEN_PERF_EVENT",
    "ERROR_FAILED_TO_MMAP_PERF_DATA",
    "ERROR_FAILED_TO_MMAP_PT_DATA",
    "ERROR_FAILED_TO_ALLOCATE_OUTPUT_BUFFER",
    "ERROR_FAILED_TO_START_TRACING",
    "ERROR_FAILED_TO_STOP_TRACING",
    "ERROR_OVERWRITTEN_PT_TRACE",
    "ERROR_FAILED_TO_READ_PT_DATA",
    "ERROR_OVERWRITTEN_SIDEBAND_DATA",
    "ERROR_FAILED_TO_READ_SIDEBANBD_DATA",
};
#define NUM_STATUS ((int)(sizeof(status_names) / sizeof(status_names[0])))

typedef struct {
    drpttracer_output_t *output;
    void *handle;
} per_thread_t;

static int tls_idx = -1;

/* Options. */
static bool expect_init;
static int expect_handle = DRPTTRACER_SUCCESS;
static int sample_at = 100;
static int fd_slack = 2;
static long rss_slack_kb = 16384;

/* State and counters (updated from many threads). */
static bool init_ok;
static int threads_seen;
static int threads_exited;
static int calls;
static int mismatches;
static int handles_ok;
static int handles_failed;
static int outputs_live;
static int handles_live;
static int fds_sample = -1;
static long rss_sample_kb = -1;
static int first_failure_printed;

static int
atomic_inc(int *v)
{
    return __atomic_add_fetch(v, 1, __ATOMIC_SEQ_CST);
}

static void
atomic_add(int *v, int n)
{
    __atomic_add_fetch(v, n, __ATOMIC_SEQ_CST);
}

static const char *
status_name(int s)
{
    if (s == EXPECT_ANY_FAILURE)
        return "any failure";
    return s >= 0 && s < NUM_STATUS ? status_names[s] : "(out of range)";
}

static const char *
last_error(void)
{
    if (drpttracer_ext_last_error == NULL)
        return "(drpttracer_ext_last_error absent: DynamoRIO's own library)";
    const char *msg = drpttracer_ext_last_error();
    return msg == NULL ? "(null)" : msg;
}

static void
mismatch(const char *what, const char *expected, const char *got)
{
    int n = atomic_inc(&mismatches);
    if (n <= MAX_REPORTED_MISMATCHES) {
        dr_fprintf(STDERR,
                   "drpttracer-client: MISMATCH tid=%d %s: expected %s, got %s "
                   "(last error: %s)\n",
                   (int)dr_get_thread_id(dr_get_current_drcontext()), what, expected,
                   got, last_error());
    }
}

/* Counts one call and checks its status. */
static drpttracer_status_t
check(const char *what, drpttracer_status_t got, int expected)
{
    atomic_inc(&calls);
    bool ok = expected == EXPECT_ANY_FAILURE ? got != DRPTTRACER_SUCCESS
                                              : (int)got == expected;
    if (!ok)
        mismatch(what, status_name(expected), status_name((int)got));
    return got;
}

static void
check_true(const char *what, bool cond)
{
    if (!cond)
        mismatch(what, "true", "false");
}

/* ---- Measurements ---------------------------------------------------------------- */

static int
count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.')
            n++;
    }
    closedir(d);
    return n - 1; /* not the directory's own fd */
}

static long
vm_rss_kb(void)
{
    char buf[4096];
    file_t f = dr_open_file("/proc/self/status", DR_FILE_READ);
    if (f == INVALID_FILE)
        return -1;
    ssize_t n = dr_read_file(f, buf, sizeof(buf) - 1);
    dr_close_file(f);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    const char *p = strstr(buf, "VmRSS:");
    if (p == NULL)
        return -1;
    return strtol(p + 6, NULL, 10);
}

/* ---- Calls that need no handle ------------------------------------------------------ */

static void
check_output_shape(drpttracer_output_t *out, uint pt_shift, size_t sd_shift)
{
    size_t page = dr_page_size();
    check_true("create_output: output != NULL", out != NULL);
    if (out == NULL)
        return;
    check_true("create_output: pt_buffer != NULL", out->pt_buffer != NULL);
    check_true("create_output: pt_buffer_size == 2^shift pages",
               out->pt_buffer_size == ((size_t)1 << pt_shift) * page);
    check_true("create_output: pt_size == 0", out->pt_size == 0);
    check_true("create_output: sideband_size == 0", out->sideband_size == 0);
    if (sd_shift == 0) {
        check_true("create_output(sd 0): sideband_buffer == NULL",
                   out->sideband_buffer == NULL);
        check_true("create_output(sd 0): sideband_buffer_size == 0",
                   out->sideband_buffer_size == 0);
    } else {
        check_true("create_output: sideband_buffer != NULL", out->sideband_buffer != NULL);
        check_true("create_output: sideband_buffer_size == (2^sd + 1) pages",
                   out->sideband_buffer_size == (((size_t)1 << sd_shift) + 1) * page);
    }
}

/* Writes every page of the buffers (a leaked output then stays resident). */
static void
touch_output(drpttracer_output_t *out)
{
    size_t page = dr_page_size();
    if (out == NULL)
        return;
    if (out->pt_buffer != NULL) {
        for (size_t i = 0; i < out->pt_buffer_size; i += page)
            ((volatile char *)out->pt_buffer)[i] = 1;
    }
    if (out->sideband_buffer != NULL) {
        for (size_t i = 0; i < out->sideband_buffer_size; i += page)
            ((volatile char *)out->sideband_buffer)[i] = 1;
    }
}

static void
bad_parameter_calls(void *drcontext)
{
    drpttracer_output_t *out = NULL;
    void *h = NULL;
    pt_metadata_t md;
    check("create_output(out NULL)", drpttracer_create_output(drcontext, PT_SHIFT, 0, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("create_output(pt shift 0)", drpttracer_create_output(drcontext, 0, 0, &out),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("destroy_output(NULL)", drpttracer_destroy_output(drcontext, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("create_handle(out NULL)",
          drpttracer_create_handle(drcontext, DRPTTRACER_TRACING_ONLY_KERNEL, PT_SHIFT,
                                   PT_SHIFT, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("create_handle(pt shift 0)",
          drpttracer_create_handle(drcontext, DRPTTRACER_TRACING_ONLY_KERNEL, 0, PT_SHIFT,
                                   &h),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("create_handle(sideband shift 0)",
          drpttracer_create_handle(drcontext, DRPTTRACER_TRACING_ONLY_KERNEL, PT_SHIFT, 0,
                                   &h),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("create_handle(mode 7)",
          drpttracer_create_handle(drcontext, BAD_MODE, PT_SHIFT, PT_SHIFT, &h),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check_true("create_handle(invalid): handle left NULL", h == NULL);
    check("destroy_handle(NULL)", drpttracer_destroy_handle(drcontext, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("start_tracing(NULL)", drpttracer_start_tracing(drcontext, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("stop_tracing(NULL handle)", drpttracer_stop_tracing(drcontext, NULL, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("get_pt_metadata(NULL handle)", drpttracer_get_pt_metadata(NULL, &md),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
}

/* ---- Events -------------------------------------------------------------------------- */

static void
event_thread_init(void *drcontext)
{
    atomic_inc(&threads_seen);
    per_thread_t *pt = (per_thread_t *)dr_thread_alloc(drcontext, sizeof(*pt));
    memset(pt, 0, sizeof(*pt));
    drmgr_set_tls_field(drcontext, tls_idx, pt);

    /* The thread's output, as syscall_pt_trace.cpp makes it (no sideband buffer). */
    if (check("create_output(pt 4, sd 0)",
              drpttracer_create_output(drcontext, PT_SHIFT, 0, &pt->output),
              DRPTTRACER_SUCCESS) == DRPTTRACER_SUCCESS) {
        atomic_inc(&outputs_live);
        check_output_shape(pt->output, PT_SHIFT, 0);
        touch_output(pt->output);
    } else {
        pt->output = NULL;
    }
    /* One with a sideband buffer, freed at once. */
    drpttracer_output_t *sd = NULL;
    if (check("create_output(pt 4, sd 1)",
              drpttracer_create_output(drcontext, PT_SHIFT, SD_SHIFT, &sd),
              DRPTTRACER_SUCCESS) == DRPTTRACER_SUCCESS) {
        check_output_shape(sd, PT_SHIFT, SD_SHIFT);
        touch_output(sd);
        check("destroy_output(sd)", drpttracer_destroy_output(drcontext, sd),
              DRPTTRACER_SUCCESS);
    }
    bad_parameter_calls(drcontext);
}

/* Ends a window opened at pre-syscall: stop, metadata, destroy. */
static void
finish_window(void *drcontext, per_thread_t *pt)
{
    pt_metadata_t md;
    if (pt->handle == NULL)
        return;
    check("stop_tracing(output NULL)", drpttracer_stop_tracing(drcontext, pt->handle, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    if (pt->output != NULL) {
        if (check("stop_tracing", drpttracer_stop_tracing(drcontext, pt->handle, pt->output),
                  DRPTTRACER_SUCCESS) == DRPTTRACER_SUCCESS) {
            check_true("stop_tracing: pt_size <= pt_buffer_size",
                       pt->output->pt_size <= pt->output->pt_buffer_size);
            check_true("stop_tracing(kernel only): sideband_size == 0",
                       pt->output->sideband_size == 0);
        }
    }
    check("get_pt_metadata", drpttracer_get_pt_metadata(pt->handle, &md),
          DRPTTRACER_SUCCESS);
    check("get_pt_metadata(out NULL)", drpttracer_get_pt_metadata(pt->handle, NULL),
          DRPTTRACER_ERROR_INVALID_PARAMETER);
    check("destroy_handle", drpttracer_destroy_handle(drcontext, pt->handle),
          DRPTTRACER_SUCCESS);
    pt->handle = NULL;
    atomic_add(&handles_live, -1);
}

static bool
event_filter_syscall(void *drcontext, int sysnum)
{
    return true;
}

static bool
event_pre_syscall(void *drcontext, int sysnum)
{
    per_thread_t *pt = (per_thread_t *)drmgr_get_tls_field(drcontext, tls_idx);
    if (!init_ok || pt == NULL)
        return true;
    if (pt->handle != NULL) /* not ended (cannot happen: post-syscall ends it) */
        finish_window(drcontext, pt);
    void *h = NULL;
    drpttracer_status_t st =
        check("create_handle(kernel only)",
              drpttracer_create_handle(drcontext, DRPTTRACER_TRACING_ONLY_KERNEL, PT_SHIFT,
                                       PT_SHIFT, &h),
              expect_handle);
    if (st != DRPTTRACER_SUCCESS) {
        atomic_inc(&handles_failed);
        if (atomic_inc(&first_failure_printed) == 1) {
            dr_fprintf(STDERR,
                       "drpttracer-client: create_handle: %s (last error: %s) "
                       "(printed once)\n",
                       status_name(st), last_error());
        }
        return true;
    }
    atomic_inc(&handles_ok);
    atomic_inc(&handles_live);
    pt->handle = h;
    check("start_tracing", drpttracer_start_tracing(drcontext, h), DRPTTRACER_SUCCESS);
    return true;
}

static void
event_post_syscall(void *drcontext, int sysnum)
{
    per_thread_t *pt = (per_thread_t *)drmgr_get_tls_field(drcontext, tls_idx);
    if (pt != NULL)
        finish_window(drcontext, pt);
}

static void
event_thread_exit(void *drcontext)
{
    per_thread_t *pt = (per_thread_t *)drmgr_get_tls_field(drcontext, tls_idx);
    if (pt == NULL)
        return;
    finish_window(drcontext, pt); /* a window left open by SYS_exit */
    if (pt->output != NULL) {
        if (check("destroy_output", drpttracer_destroy_output(drcontext, pt->output),
                  DRPTTRACER_SUCCESS) == DRPTTRACER_SUCCESS)
            atomic_add(&outputs_live, -1);
        pt->output = NULL;
    }
    drmgr_set_tls_field(drcontext, tls_idx, NULL);
    dr_thread_free(drcontext, pt, sizeof(*pt));
    if (atomic_inc(&threads_exited) == sample_at) {
        fds_sample = count_fds();
        rss_sample_kb = vm_rss_kb();
    }
}

static void
event_exit(void)
{
    int fds_end = count_fds();
    long rss_end_kb = vm_rss_kb();
    bool leak = outputs_live != 0 || handles_live != 0;
    if (fds_sample >= 0 && fds_end > fds_sample + fd_slack)
        leak = true;
    if (rss_sample_kb >= 0 && rss_end_kb > rss_sample_kb + rss_slack_kb)
        leak = true;
    if (init_ok)
        drpttracer_exit();
    dr_fprintf(STDERR,
               "drpttracer-client: threads=%d calls=%d mismatches=%d init=%d handles_ok=%d "
               "handles_failed=%d outputs_live=%d handles_live=%d fds@%d=%d fds@exit=%d "
               "rss@%d=%ldkB rss@exit=%ldkB leak=%s\n",
               threads_seen, calls, mismatches, init_ok ? 1 : 0, handles_ok,
               handles_failed, outputs_live, handles_live, sample_at, fds_sample, fds_end,
               sample_at, rss_sample_kb, rss_end_kb, leak ? "yes" : "no");
    bool failed = mismatches > 0 || leak;
    drmgr_unregister_tls_field(tls_idx);
    drmgr_exit();
    if (failed)
        dr_abort_with_code(3);
}

static bool
parse_options(int argc, const char *argv[])
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "expect_init=", 12) == 0) {
            expect_init = atoi(a + 12) != 0;
        } else if (strncmp(a, "expect_handle=", 14) == 0) {
            const char *v = a + 14;
            if (strncmp(v, "DRPTTRACER_", 11) == 0)
                v += 11;
            if (strcmp(v, "fail") == 0) {
                expect_handle = EXPECT_ANY_FAILURE;
                continue;
            }
            int s;
            for (s = 0; s < NUM_STATUS; s++) {
                if (strcmp(v, status_names[s]) == 0)
                    break;
            }
            if (s == NUM_STATUS) {
                dr_fprintf(STDERR, "drpttracer-client: unknown status '%s'\n", v);
                return false;
            }
            expect_handle = s;
        } else if (strncmp(a, "sample_at=", 10) == 0) {
            sample_at = atoi(a + 10);
        } else if (strncmp(a, "fd_slack=", 9) == 0) {
            fd_slack = atoi(a + 9);
        } else if (strncmp(a, "rss_slack_kb=", 13) == 0) {
            rss_slack_kb = atol(a + 13);
        } else {
            dr_fprintf(STDERR, "drpttracer-client: unknown option '%s'\n", a);
            return false;
        }
    }
    return true;
}

DR_EXPORT void
dr_client_main(client_id_t id, int argc, const char *argv[])
{
    dr_set_client_name("drpttracer API check", "");
    if (!parse_options(argc, argv))
        dr_abort_with_code(2);
    if (!drmgr_init())
        dr_abort_with_code(2);
    tls_idx = drmgr_register_tls_field();

    init_ok = drpttracer_init();
    atomic_inc(&calls);
    if (init_ok != expect_init)
        mismatch("init", expect_init ? "true" : "false", init_ok ? "true" : "false");
    if (!init_ok) {
        dr_fprintf(STDERR, "drpttracer-client: drpttracer_init returned false (%s)\n",
                   last_error());
    }
    /* Reference counted: a second init gives the same answer; its exit (when it
     * succeeded) leaves the first reference in place. */
    bool again = drpttracer_init();
    atomic_inc(&calls);
    if (again != init_ok)
        mismatch("init (second)", init_ok ? "true" : "false", again ? "true" : "false");
    if (again)
        drpttracer_exit();

    if (!drmgr_register_exit_event(event_exit) ||
        !drmgr_register_filter_syscall_event(event_filter_syscall) ||
        !drmgr_register_thread_init_event(event_thread_init) ||
        !drmgr_register_thread_exit_event(event_thread_exit) ||
        !drmgr_register_pre_syscall_event(event_pre_syscall) ||
        !drmgr_register_post_syscall_event(event_post_syscall))
        dr_abort_with_code(2);
}
