/* The bare C baseline of benches/decode.rs: a ptxed-style loop over libipt's block decoder
 * (sync forward, drain pending events, pt_blk_next, count instructions), nothing else.
 *
 * The decoder, its image and the output buffers are set up by the caller (Rust, through
 * libipt-sys, linked into the same bench binary); the struct sizes, the offset of
 * pt_block.ninsn and the status/error codes come from there too, so this file needs no
 * libipt header and always matches the bundled libipt. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct pt_block_decoder;
extern int pt_blk_sync_forward(struct pt_block_decoder *decoder);
extern int pt_blk_next(struct pt_block_decoder *decoder, void *block, size_t size);
extern int pt_blk_event(struct pt_block_decoder *decoder, void *event, size_t size);

struct bare_loop_abi {
    void *block;
    size_t block_size;
    size_t ninsn_offset;
    void *event;
    size_t event_size;
    int status_event_pending;
    int status_eos;
    int error_eos;
};

uint64_t pttracer_bench_bare_block_loop(struct pt_block_decoder *dec,
                                        const struct bare_loop_abi *abi) {
    uint64_t insns = 0;
    for (;;) {
        int status = pt_blk_sync_forward(dec);
        if (status < 0)
            return insns;
        for (;;) {
            while (status >= 0 && (status & abi->status_event_pending))
                status = pt_blk_event(dec, abi->event, abi->event_size);
            if (status < 0)
                break; /* resync */
            /* The trace ends here (ptxed stops at pts_eos too). */
            if (status & abi->status_eos)
                return insns;
            status = pt_blk_next(dec, abi->block, abi->block_size);
            uint16_t ninsn;
            memcpy(&ninsn, (const char *)abi->block + abi->ninsn_offset, sizeof ninsn);
            insns += ninsn;
            if (status < 0) {
                if (status == -abi->error_eos || (status & abi->status_eos))
                    return insns;
                break; /* resync */
            }
        }
    }
}
