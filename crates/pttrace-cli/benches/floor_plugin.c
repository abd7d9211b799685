/* The floor of any tracer built on QEMU's TCG plugin API v1 (QEMU 7.2): a plugin whose
 * execution callback only stores the block's user data into a small ring, the least a
 * plugin can do to learn the executed block sequence. `cargo bench --bench qemu` runs it
 * beside bare QEMU and the pttrace plugin, so the QEMU backend's overhead is read against
 * what the callback itself costs. The few API declarations it needs are written out
 * here (as in QEMU's qemu-plugin.h, API version 1). */
#include <stdint.h>
#include <stdlib.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_info_t;
typedef void (*tb_trans_cb_t)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*vcpu_udata_cb_t)(unsigned int, void *);
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb_t);
extern void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *, vcpu_udata_cb_t,
                                                  int, void *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define RING 65536
static uint64_t *ring;
static uint64_t next;

static void on_exec(unsigned int vcpu, void *udata) {
    (void)vcpu;
    ring[next++ & (RING - 1)] = (uint64_t)udata;
}

static void on_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    /* 0: QEMU_PLUGIN_CB_NO_REGS; the block's address as its user data. */
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, 0, tb);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                             const struct qemu_info_t *info,
                                                             int argc, char **argv) {
    (void)info;
    (void)argc;
    (void)argv;
    ring = calloc(RING, sizeof *ring);
    if (!ring)
        return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_trans);
    return 0;
}
