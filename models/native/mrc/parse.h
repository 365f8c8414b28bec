/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Strict parsers for the text trace formats.  They work on a buffer of whole
 * lines and expand each request into the 4 KiB page keys it covers.
 */
#ifndef CP_PARSE_H
#define CP_PARSE_H

#include <stddef.h>
#include <stdint.h>

enum cp_text_format {
	CP_FMT_TXT = 0,	/* one decimal key per line */
	CP_FMT_LIS = 1,	/* ARC: start_block num_blocks ignored request_no */
	CP_FMT_CSV = 2,	/* CloudPhysics: version,time,op,size,lbn (lbn in 512 B sectors) */
};

struct cp_keybuf {
	uint64_t *keys;
	size_t len, cap;
};

struct cp_parse_result {
	uint64_t requests;	/* request lines parsed */
	uint64_t lines;		/* lines consumed, blank and header included */
	uint64_t bad_line;	/* 1-based within the buffer; 0 = no error */
	const char *error;	/* static description of the error */
	size_t consumed;	/* bytes of the lines consumed */
};

/*
 * Parse `len` bytes of complete lines (the last may lack its newline).
 * `header_ok` lets the first line be a CSV header.  Keys are appended to
 * `out`; returns 0, -1 on a malformed line (result says where and why) or
 * -2 when out of memory.
 *
 * A line may stand for up to 2^20 pages, so a few KiB of text can expand
 * to gigabytes of keys: with `max_keys` > 0 the parser stops after the
 * line that brings `out` to max_keys keys or more, and `consumed` says how
 * far it got (the caller parses the rest in another call).  Memory then
 * stays within max_keys + 2^20 keys a call, whatever the text.
 */
int cp_parse_text(const char *buf, size_t len, enum cp_text_format fmt,
		  int header_ok, size_t max_keys, struct cp_keybuf *out,
		  struct cp_parse_result *res);

#endif /* CP_PARSE_H */
