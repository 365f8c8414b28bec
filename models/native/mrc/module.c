// SPDX-License-Identifier: Apache-2.0
/*
 * cachepilot.models._mrc: the native MRC core.  Python hands numpy arrays in
 * through the buffer protocol; results come back as bytes objects that the
 * Python side views with numpy.frombuffer (no numpy C API needed here).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "cachepilot_hash.h"
#include "cachepilot_hll.h"
#include "hllstack.h"
#include "mruchain.h"
#include "parse.h"
#include "stackdist.h"
#include "pymodule.h"

/* A C-contiguous buffer of 8-byte items (numpy uint64/int64 arrays). */
static int get_u64_buffer(PyObject *obj, Py_buffer *view, int writable)
{
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;

	if (writable)
		flags |= PyBUF_WRITABLE;
	if (PyObject_GetBuffer(obj, view, flags))
		return -1;
	if (view->itemsize != 8 || view->ndim > 1) {
		PyErr_SetString(PyExc_TypeError,
				"expected a 1-D array of 64-bit integers");
		PyBuffer_Release(view);
		return -1;
	}
	return 0;
}

/*
 * The number of index bits of a sketch buffer of `len` bytes; -1, with a
 * ValueError set, when no sketch has that size.
 */
static int sketch_bits(Py_ssize_t len)
{
	int bits = 4;

	while (bits <= 18 && ((Py_ssize_t)1 << bits) != len)
		bits++;
	if (bits <= 18)
		return bits;
	PyErr_Format(PyExc_ValueError,
		     "a sketch has 2^4 to 2^18 one-byte registers, not %zd", len);
	return -1;
}

/* The end of a call on two buffers: both released; NULL if it raised. */
static PyObject *release_both(Py_buffer *a, Py_buffer *b)
{
	PyBuffer_Release(a);
	PyBuffer_Release(b);
	if (PyErr_Occurred())
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *py_hash64(PyObject *self, PyObject *arg)
{
	unsigned long long x = PyLong_AsUnsignedLongLong(arg);

	if (x == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	return PyLong_FromUnsignedLongLong(cp_hash64(x));
}

static PyObject *py_hash_into(PyObject *self, PyObject *args)
{
	PyObject *src_obj, *dst_obj;
	Py_buffer src, dst;
	Py_ssize_t i, n;

	if (!PyArg_ParseTuple(args, "OO", &src_obj, &dst_obj))
		return NULL;
	if (get_u64_buffer(src_obj, &src, 0))
		return NULL;
	if (get_u64_buffer(dst_obj, &dst, 1)) {
		PyBuffer_Release(&src);
		return NULL;
	}
	n = src.len / 8;
	if (dst.len / 8 < n) {
		PyErr_SetString(PyExc_ValueError, "output array is too short");
	} else {
		const uint64_t *k = src.buf;
		uint64_t *h = dst.buf;

		Py_BEGIN_ALLOW_THREADS
		for (i = 0; i < n; i++)
			h[i] = cp_hash64(k[i]);
		Py_END_ALLOW_THREADS
	}
	return release_both(&src, &dst);
}

/* hll_add(keys, registers): count keys into a HyperLogLog sketch, a
 * writable buffer of 2^bits bytes (4 <= bits <= 18). */
static PyObject *py_hll_add(PyObject *self, PyObject *args)
{
	PyObject *src_obj, *reg_obj;
	Py_buffer src, reg;

	if (!PyArg_ParseTuple(args, "OO", &src_obj, &reg_obj))
		return NULL;
	if (get_u64_buffer(src_obj, &src, 0))
		return NULL;
	if (PyObject_GetBuffer(reg_obj, &reg, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)) {
		PyBuffer_Release(&src);
		return NULL;
	}
	int bits = sketch_bits(reg.len);

	if (bits >= 0) {
		const uint64_t *k = src.buf;
		unsigned char *r = reg.buf;
		size_t n = src.len / 8;

		Py_BEGIN_ALLOW_THREADS
		for (size_t i = 0; i < n; i++)
			cp_hll_add(r, cp_hash64(k[i]), (unsigned int)bits);
		Py_END_ALLOW_THREADS
	}
	return release_both(&src, &reg);
}

static PyObject *py_hll_estimate(PyObject *self, PyObject *arg)
{
	Py_buffer reg;
	double est = 0.0;
	int bits;

	if (PyObject_GetBuffer(arg, &reg, PyBUF_C_CONTIGUOUS))
		return NULL;
	bits = sketch_bits(reg.len);
	if (bits >= 0)
		est = cp_hll_estimate(reg.buf, (unsigned int)bits);
	PyBuffer_Release(&reg);
	if (PyErr_Occurred())
		return NULL;
	return PyFloat_FromDouble(est);
}

/* hll_union_matrix(sketches, slices) -> bytes of slices x slices doubles:
 * [i, j] = distinct keys of slices i..j (i <= j), from `slices` sketches
 * laid end to end, oldest first. */
static PyObject *py_hll_union_matrix(PyObject *self, PyObject *args)
{
	Py_ssize_t slices;
	PyObject *obj, *out = NULL;
	Py_buffer view;
	int bits = -1, rc = 0;

	if (!PyArg_ParseTuple(args, "On", &obj, &slices))
		return NULL;
	if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS))
		return NULL;
	if (slices < 1 || view.len % slices)
		PyErr_SetString(PyExc_ValueError,
				"the sketches do not split into that many slices");
	else if ((bits = sketch_bits(view.len / slices)) < 0)
		out = NULL;	/* sketch_bits set the error */
	else if ((size_t)slices > ((size_t)1 << 14))
		PyErr_SetString(PyExc_ValueError, "at most 16384 slices");
	else
		out = PyBytes_FromStringAndSize(NULL, slices * slices * sizeof(double));
	if (out) {
		Py_BEGIN_ALLOW_THREADS
		rc = cp_hll_union_matrix(view.buf, (size_t)slices, (unsigned int)bits,
					 (double *)PyBytes_AS_STRING(out));
		Py_END_ALLOW_THREADS
		if (rc) {
			Py_CLEAR(out);
			PyErr_NoMemory();
		}
	}
	PyBuffer_Release(&view);
	return out;
}

/* Indices of the keys whose hash is below the threshold, as u64 bytes. */
static PyObject *py_sample_index(PyObject *self, PyObject *args)
{
	unsigned long long threshold;
	PyObject *obj, *out;
	Py_buffer view;
	uint64_t *idx;
	size_t n, m = 0;

	if (!PyArg_ParseTuple(args, "OK", &obj, &threshold))
		return NULL;
	if (get_u64_buffer(obj, &view, 0))
		return NULL;
	n = view.len / 8;
	idx = malloc((n ? n : 1) * sizeof(*idx));
	if (!idx) {
		PyBuffer_Release(&view);
		return PyErr_NoMemory();
	}
	Py_BEGIN_ALLOW_THREADS
	const uint64_t *k = view.buf;

	for (size_t i = 0; i < n; i++) {
		idx[m] = i;
		m += cp_hash64(k[i]) < threshold;
	}
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&view);
	out = PyBytes_FromStringAndSize((const char *)idx, m * sizeof(*idx));
	free(idx);
	return out;
}

/* A C-contiguous buffer of `itemsize`-byte items holding at least `n`. */
static int get_sized_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize,
			    Py_ssize_t n, int writable, const char *what)
{
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;

	if (writable)
		flags |= PyBUF_WRITABLE;
	if (PyObject_GetBuffer(obj, view, flags))
		return -1;
	if (view->itemsize != itemsize || view->len < n * itemsize) {
		PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes",
			     what, n, itemsize);
		PyBuffer_Release(view);
		return -1;
	}
	return 0;
}

static PyObject *py_mru_bins(PyObject *self, PyObject *args)
{
	PyObject *obj[6];
	Py_buffer v[6];
	long long base, k, nbins, m;
	int got = 0, rc = 0;

	if (!PyArg_ParseTuple(args, "OOOOOOLLLL", &obj[0], &obj[1], &obj[2], &obj[3],
			      &obj[4], &obj[5], &m, &nbins, &base, &k))
		return NULL;
	if (m < 0 || nbins < 0 || base < 0 || k < 0) {
		PyErr_SetString(PyExc_ValueError, "negative size");
		return NULL;
	}
	const Py_ssize_t size[6] = { 8, 1, 1, 8, 8, 8 };
	const Py_ssize_t count[6] = { m, m * k, m * k, m, nbins + 1, (base + nbins) * k };
	static const char *const name[6] = { "w", "known", "free", "target", "bounds",
					     "hit" };

	for (; got < 6; got++)
		if (get_sized_buffer(obj[got], &v[got], size[got], count[got], got == 5,
				     name[got]))
			break;
	if (got == 6) {
		const int64_t *bounds = v[4].buf, *target = v[3].buf;

		/* every index the loop follows stays within its buffer */
		for (long long b = 0; b < nbins && !rc; b++)
			rc = bounds[b] < 0 || bounds[b] > bounds[b + 1] || bounds[b + 1] > m;
		for (long long i = 0; i < m && !rc; i++)
			rc = target[i] < 0 || target[i] >= base + nbins;
		if (rc)
			PyErr_SetString(PyExc_ValueError, "bounds or targets out of range");
		else {
			Py_BEGIN_ALLOW_THREADS
			rc = cp_mru_bins(v[0].buf, v[1].buf, v[2].buf, target, bounds, nbins,
					 base, k, v[5].buf);
			Py_END_ALLOW_THREADS
			if (rc)
				PyErr_NoMemory();
		}
	}
	while (got-- > 0)
		PyBuffer_Release(&v[got]);
	if (rc || PyErr_Occurred())
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *py_parse_text(PyObject *self, PyObject *args)
{
	struct cp_parse_result res;
	struct cp_keybuf out = { 0 };
	PyObject *keys, *ret;
	Py_buffer view;
	Py_ssize_t max_keys = 0;
	int fmt, header_ok, rc;

	if (!PyArg_ParseTuple(args, "y*ip|n", &view, &fmt, &header_ok, &max_keys))
		return NULL;
	if (max_keys < 0) {
		PyBuffer_Release(&view);
		PyErr_SetString(PyExc_ValueError, "max_keys must be >= 0");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = cp_parse_text(view.buf, view.len, fmt, header_ok, (size_t)max_keys,
			   &out, &res);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&view);
	if (rc == -2) {
		free(out.keys);
		return PyErr_NoMemory();
	}
	keys = PyBytes_FromStringAndSize((const char *)out.keys,
					 out.len * sizeof(*out.keys));
	free(out.keys);
	if (!keys)
		return NULL;
	ret = Py_BuildValue("(NKKKsn)", keys, (unsigned long long)res.requests,
			    (unsigned long long)res.lines,
			    (unsigned long long)res.bad_line, res.error,
			    (Py_ssize_t)res.consumed);
	return ret;
}

/* ---- StackDist ---- */

typedef struct {
	PyObject_HEAD
	struct cp_stackdist sd;
	int ready;
	int busy;	/* a feed runs without the GIL; refuse concurrent use */
} StackDistObject;

/* -1, with the error set, while a feed holds the object. */
static int sd_busy(StackDistObject *self)
{
	if (!self->busy)
		return 0;
	PyErr_SetString(PyExc_RuntimeError,
			"StackDist is being fed by another thread");
	return -1;
}

/* Called with the GIL held, so the check and the set cannot race. */
static int sd_enter(StackDistObject *self)
{
	if (!self->ready) {
		PyErr_SetString(PyExc_RuntimeError, "StackDist not initialised");
		return -1;
	}
	return sd_busy(self);
}

/* sd_enter for a method whose one optional argument is a flag named `name`
 * (hist's and hll's reset, slices' take): parsed into *flag. */
static int sd_enter_flag(StackDistObject *self, PyObject *args, PyObject *kw,
			 const char *name, int *flag)
{
	char *names[] = { (char *)name, NULL };

	*flag = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", names, flag))
		return -1;
	return sd_enter(self);
}

static int sd_init(StackDistObject *self, PyObject *args, PyObject *kw)
{
	static char *names[] = { "threshold", "max_keys", "exact", "slice_refs",
				 "max_slices", NULL };
	unsigned long long threshold = CP_THRESHOLD_ALL;
	unsigned long long max_keys = 0, slice_refs = 0;
	Py_ssize_t max_slices = 0;
	int exact = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|KKpKn", names, &threshold,
					 &max_keys, &exact, &slice_refs, &max_slices))
		return -1;
	if (max_slices && (exact || max_slices < 2 || max_slices > (1 << 16) ||
			   slice_refs % CP_SD_SLICE_UNIT)) {
		PyErr_Format(PyExc_ValueError,
			     "slices need sampling mode, 2 <= max_slices <= 65536 and "
			     "slice_refs a multiple of %d", CP_SD_SLICE_UNIT);
		return -1;
	}
	if (exact && (max_keys || threshold != CP_THRESHOLD_ALL)) {
		PyErr_SetString(PyExc_ValueError,
				"exact mode takes neither threshold nor max_keys");
		return -1;
	}
	if (threshold == 0) {
		PyErr_SetString(PyExc_ValueError, "threshold must be positive");
		return -1;
	}
	if (sd_busy(self))
		return -1;
	if (self->ready)
		cp_sd_free(&self->sd);
	self->ready = 0;
	if (cp_sd_init(&self->sd, threshold, !exact, max_keys)) {
		PyErr_NoMemory();
		return -1;
	}
	if (max_slices && cp_sd_slices_init(&self->sd, slice_refs, (size_t)max_slices)) {
		cp_sd_free(&self->sd);
		PyErr_NoMemory();
		return -1;
	}
	self->ready = 1;
	return 0;
}

static void sd_dealloc(StackDistObject *self)
{
	if (self->ready)
		cp_sd_free(&self->sd);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sd_feed(StackDistObject *self, PyObject *arg)
{
	Py_buffer view;
	int rc;

	if (sd_enter(self))
		return NULL;
	if (get_u64_buffer(arg, &view, 0))
		return NULL;
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	rc = cp_sd_feed(&self->sd, view.buf, view.len / 8);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	PyBuffer_Release(&view);
	if (rc)
		return PyErr_NoMemory();
	Py_RETURN_NONE;
}

/* hist(reset=False) -> bytes of doubles: [cold, bin1, bin2, ...] */
static PyObject *sd_hist(StackDistObject *self, PyObject *args, PyObject *kw)
{
	int reset = 0;
	size_t n;
	PyObject *out;

	if (sd_enter_flag(self, args, kw, "reset", &reset))
		return NULL;
	n = self->sd.nbins ? self->sd.nbins : 1;
	out = PyBytes_FromStringAndSize(NULL, n * sizeof(double));
	if (!out)
		return NULL;
	cp_sd_hist(&self->sd, (double *)PyBytes_AS_STRING(out), reset);
	return out;
}

/* hll(reset=False): the distinct-key sketch since the last reset (bytes;
 * empty in exact mode); reset=True starts a new one. */
static PyObject *sd_hll(StackDistObject *self, PyObject *args, PyObject *kw)
{
	Py_ssize_t len;
	PyObject *out;
	int reset = 0;

	if (sd_enter_flag(self, args, kw, "reset", &reset))
		return NULL;
	if (!self->sd.hll)
		return PyBytes_FromStringAndSize(NULL, 0);
	len = (Py_ssize_t)1 << self->sd.hll_bits;
	cp_sd_sync_hll(&self->sd);
	out = PyBytes_FromStringAndSize((const char *)self->sd.hll, len);
	if (out && reset)
		memset(self->sd.hll, 0, len);
	return out;
}

/* take_records() -> bytes of (u32 previous slice, u32 slice, u64 between)
 * records written since the last call (previous slice 2^32 - 1: a first
 * reference). */
static PyObject *sd_take_records(StackDistObject *self, PyObject *unused)
{
	PyObject *out;

	if (sd_enter(self))
		return NULL;
	out = PyBytes_FromStringAndSize((const char *)self->sd.rec,
					self->sd.nrec * sizeof(*self->sd.rec));
	if (out)
		self->sd.nrec = 0;
	return out;
}

/* close_slice(sketch=None, accesses=0): close the open slice, with the
 * sketch of its references when they came pre-sampled. */
static PyObject *sd_close_slice(StackDistObject *self, PyObject *args, PyObject *kw)
{
	static char *names[] = { "sketch", "accesses", NULL };
	unsigned long long accesses = 0;
	PyObject *sketch = Py_None;
	Py_buffer view = { 0 };
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OK", names, &sketch, &accesses))
		return NULL;
	if (sd_enter(self))
		return NULL;
	if (!self->sd.slice_hll) {
		PyErr_SetString(PyExc_ValueError, "this StackDist keeps no slices");
		return NULL;
	}
	if (sketch != Py_None) {
		if (PyObject_GetBuffer(sketch, &view, PyBUF_C_CONTIGUOUS))
			return NULL;
		if (view.len != ((Py_ssize_t)1 << self->sd.hll_bits)) {
			PyErr_Format(PyExc_ValueError, "a sketch has %zd registers, not %zd",
				     (Py_ssize_t)1 << self->sd.hll_bits, view.len);
			PyBuffer_Release(&view);
			return NULL;
		}
	}
	rc = cp_sd_close_slice(&self->sd, sketch != Py_None ? view.buf : NULL, accesses);
	if (sketch != Py_None)
		PyBuffer_Release(&view);
	if (rc) {
		PyErr_SetString(PyExc_OverflowError, "slice numbers are spent");
		return NULL;
	}
	Py_RETURN_NONE;
}

/* slices(take=False) -> (sketches, accesses, first) of the closed slices:
 * bytes of nslices sketches end to end, of u64 reference counts, of u32
 * first slice numbers; take=True forgets them. */
static PyObject *sd_slices(StackDistObject *self, PyObject *args, PyObject *kw)
{
	struct cp_stackdist *sd = &self->sd;
	PyObject *out;
	int take = 0;

	if (sd_enter_flag(self, args, kw, "take", &take))
		return NULL;
	if (!sd->slice_hll) {
		PyErr_SetString(PyExc_ValueError, "this StackDist keeps no slices");
		return NULL;
	}
	out = Py_BuildValue("(y#y#y#)",
			    (const char *)sd->slice_hll,
			    (Py_ssize_t)(sd->nslices << sd->hll_bits),
			    (const char *)sd->slice_accesses,
			    (Py_ssize_t)(sd->nslices * sizeof(*sd->slice_accesses)),
			    (const char *)sd->slice_first,
			    (Py_ssize_t)(sd->nslices * sizeof(*sd->slice_first)));
	if (out && take)
		sd->nslices = 0;
	return out;
}

static int sd_set_slice_refs(StackDistObject *self, PyObject *value, void *unused)
{
	unsigned long long v;

	if (sd_enter(self))
		return -1;
	if (!value || !self->sd.slice_hll) {
		PyErr_SetString(PyExc_AttributeError,
				"slice_refs is set only on a StackDist that keeps slices");
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(value);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	if (v % CP_SD_SLICE_UNIT) {
		PyErr_Format(PyExc_ValueError, "slice_refs must be a multiple of %d",
			     CP_SD_SLICE_UNIT);
		return -1;
	}
	self->sd.slice_refs = v;
	self->sd.slice_fill = 0;
	return 0;
}

static PyObject *sd_clear(StackDistObject *self, PyObject *unused)
{
	if (sd_enter(self))
		return NULL;
	cp_sd_clear_keys(&self->sd);
	Py_RETURN_NONE;
}

static PyObject *sd_get(StackDistObject *self, void *which)
{
	const struct cp_stackdist *sd = &self->sd;

	switch ((intptr_t)which) {
	case 0: return PyLong_FromUnsignedLongLong(sd->threshold);
	case 1: return PyFloat_FromDouble(cp_sd_rate(sd));
	case 2: return PyLong_FromSize_t(sd->live);
	case 3: return PyLong_FromUnsignedLongLong(sd->seen);
	case 4: return PyLong_FromUnsignedLongLong(sd->sampled);
	case 5: return PyLong_FromUnsignedLongLong(sd->bin_pages);
	case 6: return PyLong_FromUnsignedLongLong(sd->evicted);
	case 7: return PyLong_FromSize_t(sd->max_keys);
	case 8: return PyLong_FromUnsignedLong(sd->slice);
	case 9: return PyLong_FromUnsignedLongLong(sd->slice_fill +
						   (sd->slice_refs ? sd->hll_nbatch : 0));
	case 10: return PyLong_FromUnsignedLongLong(sd->slice_refs);
	}
	Py_RETURN_NONE;
}

static PyGetSetDef sd_getset[] = {
	{ "threshold", (getter)sd_get, NULL, "current sampling threshold", (void *)0 },
	{ "rate", (getter)sd_get, NULL, "threshold / 2^64", (void *)1 },
	{ "live", (getter)sd_get, NULL, "keys tracked", (void *)2 },
	{ "seen", (getter)sd_get, NULL, "keys offered", (void *)3 },
	{ "sampled", (getter)sd_get, NULL, "references processed", (void *)4 },
	{ "bin_pages", (getter)sd_get, NULL, "histogram bin width", (void *)5 },
	{ "evicted", (getter)sd_get, NULL, "keys dropped (fixed size)", (void *)6 },
	{ "max_keys", (getter)sd_get, NULL, "fixed-size bound (0 = none)", (void *)7 },
	{ "slice", (getter)sd_get, NULL, "number of the open slice", (void *)8 },
	{ "slice_fill", (getter)sd_get, NULL, "references in the open slice", (void *)9 },
	{ "slice_refs", (getter)sd_get, (setter)sd_set_slice_refs,
	  "automatic slice length (0 = the caller closes slices)", (void *)10 },
	{ NULL }
};

static PyMethodDef sd_methods[] = {
	{ "feed", (PyCFunction)sd_feed, METH_O,
	  "feed(keys): process a 1-D uint64 array of keys" },
	{ "hist", (PyCFunction)(void (*)(void))sd_hist,
	  METH_VARARGS | METH_KEYWORDS,
	  "hist(reset=False) -> bytes of float64 [cold, bin 1, bin 2, ...]" },
	{ "hll", (PyCFunction)(void (*)(void))sd_hll, METH_VARARGS | METH_KEYWORDS,
	  "hll(reset=False) -> bytes: HyperLogLog registers of every key offered "
	  "since the last reset (sampled or not); empty in exact mode" },
	{ "close_slice", (PyCFunction)(void (*)(void))sd_close_slice,
	  METH_VARARGS | METH_KEYWORDS,
	  "close_slice(sketch=None, accesses=0): close the open slice" },
	{ "slices", (PyCFunction)(void (*)(void))sd_slices, METH_VARARGS | METH_KEYWORDS,
	  "slices(take=False) -> (sketches, accesses u64, first slice u32) bytes" },
	{ "take_records", (PyCFunction)sd_take_records, METH_NOARGS,
	  "take_records() -> bytes of (u32 prev_slice, u32 slice, u64 between) "
	  "per sampled reference since the last call (prev_slice 2**32-1: first)" },
	{ "clear", (PyCFunction)sd_clear, METH_NOARGS,
	  "forget every tracked key and the histogram" },
	{ NULL }
};

static PyTypeObject StackDistType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cachepilot.models._mrc.StackDist",
	.tp_doc = "StackDist(threshold=2**64-1, max_keys=0, exact=False, slice_refs=0, "
		  "max_slices=0): "
		  "streaming Mattson stack distances with SHARDS sampling",
	.tp_basicsize = sizeof(StackDistObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)sd_init,
	.tp_dealloc = (destructor)sd_dealloc,
	.tp_methods = sd_methods,
	.tp_getset = sd_getset,
};

static PyMethodDef module_methods[] = {
	{ "hash64", py_hash64, METH_O, "cp_hash64 of one integer" },
	{ "hash_into", py_hash_into, METH_VARARGS,
	  "hash_into(keys, out): out[i] = cp_hash64(keys[i])" },
	{ "sample_index", py_sample_index, METH_VARARGS,
	  "sample_index(keys, threshold) -> bytes of u64 indices with hash < threshold" },
	{ "hll_estimate", py_hll_estimate, METH_O,
	  "hll_estimate(registers) -> distinct keys counted into a sketch" },
	{ "hll_union_matrix", py_hll_union_matrix, METH_VARARGS,
	  "hll_union_matrix(sketches, slices) -> bytes of slices^2 doubles: "
	  "[i, j] = distinct keys of slices i..j" },
	{ "hll_add", py_hll_add, METH_VARARGS,
	  "hll_add(keys, registers): count keys into a writable sketch of 2^bits bytes" },
	{ "mru_bins", py_mru_bins, METH_VARARGS,
	  "mru_bins(w, known, free, target, bounds, hit, m, nbins, base, k): the hit "
	  "ratios of MRU's chain model, bin by bin, into rows base.. of hit" },
	{ "parse_text", py_parse_text, METH_VARARGS,
	  "parse_text(buf, fmt, header_ok, max_keys=0) -> (keys, requests, lines, bad_line, "
	  "error, consumed): stops after the line that makes max_keys keys (0: no bound)" },
	{ NULL }
};

static struct PyModuleDef module_def =
	CP_MODULE_DEF("_mrc", "cachepilot's native MRC core", module_methods);

PyMODINIT_FUNC PyInit__mrc(void)
{
	PyObject *m = cp_module_with_type(&module_def, &StackDistType, "StackDist");

	if (!m)
		return NULL;
	PyModule_AddIntConstant(m, "HLL_BITS", CP_HLL_BITS);
	PyModule_AddIntConstant(m, "HLL_REGS", CP_HLL_REGS);
	PyModule_AddIntConstant(m, "FMT_TXT", CP_FMT_TXT);
	PyModule_AddIntConstant(m, "FMT_LIS", CP_FMT_LIS);
	PyModule_AddIntConstant(m, "FMT_CSV", CP_FMT_CSV);
	return m;
}
