/* A ptxed-style loop over libipt's block decoder with ptxed's --resync-on-error
 * (pt_blk_resync, libipt 2.2 and later), for tests/decode_fast.rs: it decodes one raw PT
 * trace of code loaded from one file and prints what ptxed would show, one line each:
 *
 *   B <ip> <ninsn> <end_ip>     a block of instructions (hex addresses)
 *   E <what>|<offset>|<ip>|<end_ip>|<ninsn>|<error>
 *                               an error: "error", "resync error" or "sync error"; the
 *                               trace offset libipt reports; the block it came with; the
 *                               negated pt_error_code
 *   F <iflag> <ip>              an iflags event (with `iflags`: ptxed's --event:iflags)
 *   V D <ip>                    tracing disabled (an asynchronous disable: where; 0: no
 *                               IP), and ptxed's "[disabled]" after a resync without IP
 *   V A <from> <to>             an asynchronous branch (to 0: no IP)
 *   V O <ip>                    an overflow (0: resolved with tracing disabled)
 *   X <why>                     the decode did not end by itself (loops, time)
 *
 * Usage: libipt_resync TRACE.pt CODE.bin LOAD_ADDRESS [iflags] */
#include <intel-pt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Enough for the tests' traces; more means libipt does not move on. */
#define MAX_STEPS 2000000

static struct pt_block_decoder *dec;
static long steps;

static int step(void)
{
	if (++steps < MAX_STEPS)
		return 1;
	printf("X more than %d steps\n", MAX_STEPS);
	return 0;
}

static uint8_t *read_file(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		perror(path);
		exit(2);
	}
	buf = malloc((size_t) n + 1);
	if (!buf || fread(buf, 1, (size_t) n, f) != (size_t) n) {
		perror(path);
		exit(2);
	}
	fclose(f);
	*size = (size_t) n;
	return buf;
}

static void error(const char *what, int errcode, const struct pt_block *block)
{
	uint64_t offset = 0;

	(void) pt_blk_get_offset(dec, &offset);
	printf("E %s|%" PRIu64 "|%" PRIx64 "|%" PRIx64 "|%u|%d\n", what, offset, block->ip,
	       block->end_ip, block->ninsn, -errcode);
}

static int next_event(void)
{
	struct pt_event event;
	int status = pt_blk_event(dec, &event, sizeof(event));

	if (status >= 0 && !event.status_update) {
		switch (event.type) {
		case ptev_disabled:
			printf("V D %" PRIx64 "\n", event.ip_suppressed ? 0 : event.variant.disabled.ip);
			break;
		case ptev_async_disabled:
			printf("V D %" PRIx64 "\n", event.variant.async_disabled.at);
			break;
		case ptev_async_branch:
			printf("V A %" PRIx64 " %" PRIx64 "\n", event.variant.async_branch.from,
			       event.ip_suppressed ? 0 : event.variant.async_branch.to);
			break;
		case ptev_overflow:
			printf("V O %" PRIx64 "\n", event.ip_suppressed ? 0 : event.variant.overflow.ip);
			break;
		default:
			break;
		}
	}
	if (status >= 0 && event.type == ptev_iflags && !event.status_update)
		printf("F %d %" PRIx64 "\n", event.variant.iflags.iflag,
		       event.ip_suppressed ? 0 : event.variant.iflags.ip);
	return status;
}

static int drain_events(int status)
{
	while (status >= 0 && (status & pts_event_pending) && step())
		status = next_event();
	return status;
}

/* ptxed's resync_block: pt_blk_resync, taking the events it asks to be taken. */
static int resync(void)
{
	int status;

	while (step()) {
		status = pt_blk_resync(dec);
		/* ptxed's "[disabled]" after a resync without IP. */
		if (status >= 0 && (status & pts_ip_suppressed))
			printf("V D 0\n");
		if (status != -pte_event_ignored)
			return status;
		status = next_event();
		if (status < 0)
			return status;
	}
	return -pte_internal;
}

int main(int argc, char **argv)
{
	struct pt_config config;
	struct pt_image *image;
	uint8_t *trace;
	size_t size, code_size;
	uint64_t sync = 0;

	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: %s TRACE.pt CODE.bin LOAD_ADDRESS [iflags]\n", argv[0]);
		return 2;
	}
	/* libipt's own loops end the process. */
	alarm(5);
	trace = read_file(argv[1], &size);
	free(read_file(argv[2], &code_size));
	pt_config_init(&config);
	config.begin = trace;
	config.end = trace + size;
	if (argc == 5)
		config.flags.variant.block.enable_iflags_events = 1;
	dec = pt_blk_alloc_decoder(&config);
	if (!dec)
		return 2;
	image = pt_blk_get_image(dec);
	if (pt_image_add_file(image, argv[2], 0, code_size, NULL,
			      strtoull(argv[3], NULL, 0)) < 0)
		return 2;
	while (step()) {
		struct pt_block block = {0};
		uint64_t offset;
		int status = pt_blk_sync_forward(dec);

		if (status < 0) {
			if (status == -pte_eos)
				break;
			error("sync error", status, &block);
			if (pt_blk_get_offset(dec, &offset) < 0 || offset <= sync)
				break;
			sync = offset;
			continue;
		}
		for (;;) {
			for (;;) {
				status = drain_events(status);
				if (status < 0)
					break;
				if (status & pts_eos) {
					status = -pte_eos;
					break;
				}
				if (!step())
					return 0;
				status = pt_blk_next(dec, &block, sizeof(block));
				if (block.ninsn)
					printf("B %" PRIx64 " %u %" PRIx64 "\n", block.ip, block.ninsn,
					       block.end_ip);
				if (status < 0)
					break;
			}
			if (status == -pte_eos)
				return 0;
			error("error", status, &block);
			status = resync();
			if (status < 0) {
				error("resync error", status, &block);
				break;
			}
		}
	}
	return 0;
}
