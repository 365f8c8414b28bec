// SPDX-License-Identifier: Apache-2.0
/*
 * libFuzzer target for the native text-trace parser (models/native/mrc/
 * parse.c), built with ASan and UBSan by fuzz/run.py.  The first byte picks
 * the format and whether a CSV header may lead; the rest is the text.
 * Besides memory errors it checks what parse.h promises of a result.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mrc/parse.h"

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cp_keybuf out = { 0 };
	struct cp_parse_result res;
	enum cp_text_format fmt;
	const char *text;
	size_t len, nl = 0;
	int header_ok, rc;

	if (!size)
		return 0;
	fmt = (enum cp_text_format)(data[0] % 3);
	header_ok = (data[0] >> 2) & 1;
	/* a copy of exactly the text, so ASan sees any read past its end */
	len = size - 1;
	text = malloc(len ? len : 1);
	if (!text)
		return 0;
	memcpy((char *)text, data + 1, len);
	/* bounded as the reader bounds it, smaller so that the bound is hit */
	rc = cp_parse_text(text, len, fmt, header_ok, 1 << 16, &out, &res);
	for (size_t i = 0; i < len; i++)
		nl += text[i] == '\n';
	CHECK(rc == 0 || rc == -1 || rc == -2);
	/* every line is counted, the last one whether or not it ends in \n */
	CHECK(res.lines <= nl + 1);
	CHECK(res.requests <= res.lines);
	CHECK(out.len <= out.cap);
	/* the bound holds: it stops after the line that reaches it */
	CHECK(out.len <= (1 << 16) + (1 << 20));
	if (rc == -1) {
		CHECK(res.error != NULL);
		CHECK(res.bad_line >= 1 && res.bad_line <= res.lines);
	} else {
		CHECK(res.bad_line == 0);
	}
	if (rc == 0) {
		size_t left_nl = 0;

		CHECK(res.consumed <= len);
		CHECK(res.consumed == len || text[res.consumed - 1] == '\n');
		CHECK(res.consumed == len || out.len >= (1 << 16));
		for (size_t i = 0; i < res.consumed; i++)
			left_nl += text[i] == '\n';
		CHECK(res.lines == left_nl + (res.consumed && text[res.consumed - 1] != '\n'));
		if (fmt == CP_FMT_TXT)
			CHECK(out.len == res.requests);
		else if (fmt == CP_FMT_LIS)
			CHECK(out.len >= res.requests);
	}
	free(out.keys);
	free((char *)text);
	return 0;
}
