// SPDX-License-Identifier: Apache-2.0
/* Strict text-trace parsers; see parse.h. */
#include <stdlib.h>
#include <string.h>

#include "parse.h"

#define SECTOR_SIZE	512
#define PAGE_SIZE	4096
#define MAX_EXPAND	(1u << 20)	/* pages one request may cover */

static int push(struct cp_keybuf *out, uint64_t first, uint64_t n)
{
	if (out->len + n > out->cap) {
		size_t cap = out->cap ? out->cap : 4096;
		uint64_t *k;

		while (cap < out->len + n)
			cap *= 2;
		k = realloc(out->keys, cap * sizeof(*k));
		if (!k)
			return -1;
		out->keys = k;
		out->cap = cap;
	}
	for (uint64_t i = 0; i < n; i++)
		out->keys[out->len++] = first + i;
	return 0;
}

static inline int is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/* Unsigned integer in `base` from [*p, end); fails on no digits or overflow. */
static int parse_uint(const char **p, const char *end, int base, uint64_t *v)
{
	const char *s = *p;
	uint64_t x = 0;
	int digits = 0;

	for (; s < end; s++) {
		unsigned d;

		if (*s >= '0' && *s <= '9')
			d = *s - '0';
		else if (base == 16 && *s >= 'a' && *s <= 'f')
			d = *s - 'a' + 10;
		else if (base == 16 && *s >= 'A' && *s <= 'F')
			d = *s - 'A' + 10;
		else
			break;
		if (x > (UINT64_MAX - d) / base)
			return -1;
		x = x * base + d;
		digits++;
	}
	if (!digits)
		return -1;
	*p = s;
	*v = x;
	return 0;
}

static void skip_blanks(const char **p, const char *end)
{
	while (*p < end && is_blank(**p))
		(*p)++;
}

/* Whitespace-separated unsigned decimals; exactly `n` of them. */
static const char *fields_ws(const char *s, const char *end, uint64_t *v, int n)
{
	for (int i = 0; i < n; i++) {
		skip_blanks(&s, end);
		if (s == end)
			return "too few fields";
		if (parse_uint(&s, end, 10, &v[i]))
			return "field is not an unsigned decimal integer";
		if (s < end && !is_blank(*s))
			return "field is not an unsigned decimal integer";
	}
	skip_blanks(&s, end);
	return s == end ? NULL : "too many fields";
}

static const char *parse_csv(const char *s, const char *end, uint64_t *v)
{
	/* version, time, op (hex SCSI opcode), size (bytes), lbn */
	static const int base[5] = { 10, 10, 16, 10, 10 };

	for (int i = 0; i < 5; i++) {
		skip_blanks(&s, end);
		if (parse_uint(&s, end, base[i], &v[i]))
			return i == 2 ? "op is not a hexadecimal opcode"
				      : "field is not an unsigned integer";
		skip_blanks(&s, end);
		if (i < 4) {
			if (s == end || *s != ',')
				return "expected 5 comma-separated fields";
			s++;
		}
	}
	return s == end ? NULL : "expected 5 comma-separated fields";
}

int cp_parse_text(const char *buf, size_t len, enum cp_text_format fmt,
		  int header_ok, size_t max_keys, struct cp_keybuf *out,
		  struct cp_parse_result *res)
{
	const char *p = buf, *stop = buf + len;

	memset(res, 0, sizeof(*res));
	while (p < stop && !(max_keys && out->len >= max_keys)) {
		const char *nl = memchr(p, '\n', stop - p);
		const char *end = nl ? nl : stop, *s = p;
		const char *err = NULL;
		uint64_t v[5];
		int rc = 0;

		res->lines++;
		p = nl ? nl + 1 : stop;
		skip_blanks(&s, end);
		if (s == end)
			continue;	/* blank line */

		switch (fmt) {
		case CP_FMT_TXT:
			err = fields_ws(s, end, v, 1);
			if (!err)
				rc = push(out, v[0], 1);
			break;
		case CP_FMT_LIS:
			err = fields_ws(s, end, v, 4);
			if (!err && (v[1] == 0 || v[1] > MAX_EXPAND))
				err = "block count must be between 1 and 1048576";
			if (!err && v[0] > UINT64_MAX - v[1])
				err = "block range overflows 64 bits";
			if (!err)
				rc = push(out, v[0], v[1]);
			break;
		case CP_FMT_CSV:
			if (res->lines == 1 && header_ok &&
			    !(*s >= '0' && *s <= '9'))
				continue;	/* the header line */
			err = parse_csv(s, end, v);
			if (!err && v[3] > (uint64_t)MAX_EXPAND * PAGE_SIZE)
				err = "request size is larger than 4 GiB";
			/* the request's last byte, lbn * 512 + size - 1, must fit */
			if (!err && (v[4] > UINT64_MAX / SECTOR_SIZE ||
				     v[4] * SECTOR_SIZE > UINT64_MAX - v[3]))
				err = "block address overflows 64 bits";
			if (!err && v[3]) {
				uint64_t lo = v[4] * SECTOR_SIZE;
				uint64_t first = lo / PAGE_SIZE;
				uint64_t last = (lo + v[3] - 1) / PAGE_SIZE;

				rc = push(out, first, last - first + 1);
			}
			break;
		default:
			err = "unknown text format";
		}
		if (err) {
			res->bad_line = res->lines;
			res->error = err;
			return -1;
		}
		if (rc)
			return -2;
		res->requests++;
	}
	res->consumed = p - buf;
	return 0;
}
