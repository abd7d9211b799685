//! The part of QEMU's TCG plugin API version 1 (QEMU 6.0 to 7.2, `qemu-plugin.h`) this
//! plugin uses, declared by hand: a dozen functions, all exported by the `qemu-x86_64`
//! executable that loads the plugin (the symbols resolve at dlopen time).

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type PluginId = u64;

/// `qemu_info_t`.
#[repr(C)]
pub struct QemuInfo {
    pub target_name: *const c_char,
    pub version_min: c_int,
    pub version_cur: c_int,
    pub system_emulation: bool,
    pub smp_vcpus: c_int,
    pub max_vcpus: c_int,
}

/// Opaque `struct qemu_plugin_tb`.
#[repr(C)]
pub struct Tb {
    _opaque: [u8; 0],
}
/// Opaque `struct qemu_plugin_insn`.
#[repr(C)]
pub struct Insn {
    _opaque: [u8; 0],
}

/// `QEMU_PLUGIN_CB_NO_REGS`.
pub const CB_NO_REGS: c_int = 0;

pub type VcpuSimpleCb = extern "C" fn(id: PluginId, vcpu: c_uint);
pub type VcpuUdataCb = extern "C" fn(vcpu: c_uint, udata: *mut c_void);
pub type TbTransCb = extern "C" fn(id: PluginId, tb: *mut Tb);
pub type UdataCb = extern "C" fn(id: PluginId, udata: *mut c_void);
pub type SyscallCb = extern "C" fn(
    id: PluginId,
    vcpu: c_uint,
    num: i64,
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
    a6: u64,
    a7: u64,
    a8: u64,
);
pub type SyscallRetCb = extern "C" fn(id: PluginId, vcpu: c_uint, num: i64, ret: i64);
/// `qemu_plugin_meminfo_t`: what an access was (read with the accessors below).
pub type MemInfo = u32;
pub type VcpuMemCb = extern "C" fn(vcpu: c_uint, info: MemInfo, vaddr: u64, udata: *mut c_void);
/// `QEMU_PLUGIN_MEM_RW`: loads and stores.
pub const MEM_RW: c_int = 3;

extern "C" {
    pub fn qemu_plugin_register_vcpu_exit_cb(id: PluginId, cb: VcpuSimpleCb);
    pub fn qemu_plugin_register_vcpu_tb_trans_cb(id: PluginId, cb: TbTransCb);
    pub fn qemu_plugin_register_vcpu_tb_exec_cb(
        tb: *mut Tb,
        cb: VcpuUdataCb,
        flags: c_int,
        udata: *mut c_void,
    );
    pub fn qemu_plugin_register_vcpu_syscall_cb(id: PluginId, cb: SyscallCb);
    pub fn qemu_plugin_register_vcpu_syscall_ret_cb(id: PluginId, cb: SyscallRetCb);
    pub fn qemu_plugin_register_atexit_cb(id: PluginId, cb: UdataCb, udata: *mut c_void);
    pub fn qemu_plugin_tb_n_insns(tb: *const Tb) -> usize;
    pub fn qemu_plugin_tb_get_insn(tb: *const Tb, idx: usize) -> *mut Insn;
    pub fn qemu_plugin_insn_data(insn: *const Insn) -> *const c_void;
    pub fn qemu_plugin_insn_size(insn: *const Insn) -> usize;
    pub fn qemu_plugin_insn_vaddr(insn: *const Insn) -> u64;
    pub fn qemu_plugin_register_vcpu_mem_cb(
        insn: *mut Insn,
        cb: VcpuMemCb,
        flags: c_int,
        rw: c_int,
        udata: *mut c_void,
    );
    pub fn qemu_plugin_mem_size_shift(info: MemInfo) -> c_uint;
    pub fn qemu_plugin_mem_is_store(info: MemInfo) -> bool;
}
