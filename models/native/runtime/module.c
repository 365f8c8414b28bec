// SPDX-License-Identifier: Apache-2.0
/*
 * cachepilot.models._runtime: the CPython face of the policy runtime.
 * Thin on purpose; models/runtime.py holds the documented Python API.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include "runtime.h"
#include "pymodule.h"

typedef struct {
	PyObject_HEAD
	struct cp_instance *inst;
} CacheObject;

static int get_u64_buffer(PyObject *obj, Py_buffer *view, const char *what,
			  Py_ssize_t itemsize)
{
	if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
		return -1;
	if (view->len % itemsize) {
		PyErr_Format(PyExc_ValueError,
			     "%s must hold %zd-byte integers", what, itemsize);
		PyBuffer_Release(view);
		return -1;
	}
	return 0;
}

static int cache_init(CacheObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "policy", "capacity", "scale",
				  "policy_capacity", NULL };
	const char *policy, *err = "error";
	unsigned long long capacity, policy_capacity = 0;
	double scale = 1.0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "sK|dK", kwlist, &policy,
					 &capacity, &scale, &policy_capacity))
		return -1;
	if (!(scale > 0)) {
		PyErr_SetString(PyExc_ValueError, "scale must be positive");
		return -1;
	}
	if (self->inst) {
		cp_instance_free(self->inst);
		self->inst = NULL;
	}
	self->inst = cp_instance_new(policy, capacity, scale, policy_capacity,
				     &err);
	if (!self->inst) {
		PyErr_Format(PyExc_ValueError, "policy %s: %s", policy, err);
		return -1;
	}
	return 0;
}

static void cache_dealloc(CacheObject *self)
{
	cp_instance_free(self->inst);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static struct cp_instance *usable(CacheObject *self)
{
	if (!self->inst) {
		PyErr_SetString(PyExc_RuntimeError, "cache is not usable");
		return NULL;
	}
	if (self->inst->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"cache is in use by another thread");
		return NULL;
	}
	return self->inst;
}

static PyObject *cache_access(CacheObject *self, PyObject *args)
{
	PyObject *keys_obj, *tids_obj = Py_None, *counted_obj = Py_None;
	Py_buffer keys, tids = { 0 }, counted = { 0 };
	struct cp_instance *inst = usable(self);
	unsigned long long misses;
	PyObject *ret = NULL;
	__u64 n;

	if (!inst || !PyArg_ParseTuple(args, "O|OO", &keys_obj, &tids_obj,
				       &counted_obj))
		return NULL;
	if (get_u64_buffer(keys_obj, &keys, "keys", 8) < 0)
		return NULL;
	n = keys.len / 8;
	if (tids_obj != Py_None) {
		if (get_u64_buffer(tids_obj, &tids, "tids", 4) < 0)
			goto out;
		if ((__u64)tids.len / 4 != n) {
			PyErr_SetString(PyExc_ValueError,
					"tids and keys differ in length");
			goto out;
		}
	}
	if (counted_obj != Py_None) {
		if (get_u64_buffer(counted_obj, &counted, "counted", 1) < 0)
			goto out;
		if ((__u64)counted.len != n) {
			PyErr_SetString(PyExc_ValueError,
					"counted and keys differ in length");
			goto out;
		}
	}
	inst->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	misses = cp_instance_access(inst, keys.buf,
				    tids.buf ? tids.buf : NULL,
				    counted.buf ? counted.buf : NULL, n);
	Py_END_ALLOW_THREADS
	inst->busy = 0;
	ret = PyLong_FromUnsignedLongLong(misses);
out:
	PyBuffer_Release(&keys);
	if (tids.buf)
		PyBuffer_Release(&tids);
	if (counted.buf)
		PyBuffer_Release(&counted);
	return ret;
}

static PyObject *cache_swap_policy(CacheObject *self, PyObject *args)
{
	struct cp_instance *inst = usable(self);
	const char *policy, *err = "error";
	int ret;

	if (!inst || !PyArg_ParseTuple(args, "s", &policy))
		return NULL;
	ret = cp_instance_swap(inst, policy, &err);
	if (ret == -EIO) {
		cp_instance_free(inst);
		self->inst = NULL;
	}
	if (ret) {
		PyErr_Format(PyExc_ValueError, "policy %s: %s", policy, err);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *cache_stats(CacheObject *self, PyObject *unused)
{
	struct cp_instance *inst = usable(self);
	const struct cp_policy_stats *ps;
	const struct cp_stats *s;

	if (!inst)
		return NULL;
	s = &inst->stats;
	ps = cp_instance_policy_stats(inst);
	return Py_BuildValue(
		"{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsK}",
		"accesses", s->accesses, "hits", s->hits, "misses", s->misses,
		"inserts", s->inserts, "evictions", s->evictions,
		"admit_bypassed", s->admit_bypassed, "requests", s->requests,
		"proposed", s->proposed, "accepted", s->accepted,
		"rejected_not_cached", s->rejected_not_cached,
		"rejected_duplicate", s->rejected_duplicate,
		"rejected_excess", s->rejected_excess,
		"fallback_evictions", s->fallback_evictions,
		"counted_accesses", s->counted_accesses,
		"counted_misses", s->counted_misses,
		"cached", (unsigned long long)inst->nr_cached,
		"policy_capacity", ps ? (unsigned long long)ps->capacity : 0ULL,
		"policy_overflow", ps ? (unsigned long long)ps->overflow : 0ULL);
}

static PyObject *cache_cached_keys(CacheObject *self, PyObject *unused)
{
	struct cp_instance *inst = usable(self);
	PyObject *out;

	if (!inst)
		return NULL;
	out = PyBytes_FromStringAndSize(NULL, inst->nr_cached * 8);
	if (out)
		cp_instance_cached_keys(inst, (__u64 *)PyBytes_AS_STRING(out));
	return out;
}

static PyObject *cache_get_capacity(CacheObject *self, void *closure)
{
	struct cp_instance *inst = usable(self);

	return inst ? PyLong_FromUnsignedLongLong(inst->capacity) : NULL;
}

static PyObject *cache_get_policy(CacheObject *self, void *closure)
{
	struct cp_instance *inst = usable(self);

	return inst ? PyUnicode_FromString(inst->name) : NULL;
}

static PyObject *cache_get_reclaim_batch(CacheObject *self, void *closure)
{
	struct cp_instance *inst = usable(self);

	return inst ? PyLong_FromUnsignedLong(inst->reclaim_batch) : NULL;
}

/* A settable unsigned attribute: its name, its range and how a new value
 * takes effect; one setter serves them all through the getset closure. */
struct u64_attr {
	const char *name;
	unsigned long long lo, hi;
	void (*apply)(struct cp_instance *inst, unsigned long long v);
};

static void apply_capacity(struct cp_instance *inst, unsigned long long v)
{
	cp_instance_set_capacity(inst, v);
}

static void apply_reclaim_batch(struct cp_instance *inst, unsigned long long v)
{
	inst->reclaim_batch = (__u32)v;
}

static const struct u64_attr capacity_attr = { "capacity", 0, ~0ULL, apply_capacity };
static const struct u64_attr reclaim_batch_attr = { "reclaim_batch", 1, 1024,
						     apply_reclaim_batch };

static int cache_set_u64(CacheObject *self, PyObject *value, void *closure)
{
	const struct u64_attr *attr = closure;
	struct cp_instance *inst = usable(self);
	unsigned long long v;

	if (!inst)
		return -1;
	if (!value) {
		PyErr_Format(PyExc_AttributeError, "cannot delete %s", attr->name);
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(value);
	if (PyErr_Occurred())
		return -1;
	if (v < attr->lo || v > attr->hi) {
		PyErr_Format(PyExc_ValueError, "%s must be %llu..%llu", attr->name,
			     attr->lo, attr->hi);
		return -1;
	}
	attr->apply(inst, v);
	return 0;
}

static PyObject *cache_get_nr_cached(CacheObject *self, void *closure)
{
	struct cp_instance *inst = usable(self);

	return inst ? PyLong_FromUnsignedLongLong(inst->nr_cached) : NULL;
}

static PyMethodDef cache_methods[] = {
	{ "access", (PyCFunction)cache_access, METH_VARARGS,
	  "access(keys_u64_buffer, tids_u32_buffer=None, counted_u8_buffer=None) -> misses" },
	{ "swap_policy", (PyCFunction)cache_swap_policy, METH_VARARGS,
	  "swap_policy(name): live swap to a fresh instance of name" },
	{ "stats", (PyCFunction)cache_stats, METH_NOARGS, "counters" },
	{ "cached_keys", (PyCFunction)cache_cached_keys, METH_NOARGS,
	  "cached keys as u64 bytes, oldest first" },
	{ NULL }
};

static PyGetSetDef cache_getset[] = {
	{ "capacity", (getter)cache_get_capacity, (setter)cache_set_u64,
	  "capacity in pages; lowering it reclaims", (void *)&capacity_attr },
	{ "policy", (getter)cache_get_policy, NULL, "policy name", NULL },
	{ "nr_cached", (getter)cache_get_nr_cached, NULL, "pages cached",
	  NULL },
	{ "reclaim_batch", (getter)cache_get_reclaim_batch,
	  (setter)cache_set_u64,
	  "least pages freed when the cache is full (kernel: 32)",
	  (void *)&reclaim_batch_attr },
	{ NULL }
};

static PyTypeObject CacheType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "cachepilot.models._runtime.Cache",
	.tp_basicsize = sizeof(CacheObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "One simulated memory cgroup driven by one policy instance",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)cache_init,
	.tp_dealloc = (destructor)cache_dealloc,
	.tp_methods = cache_methods,
	.tp_getset = cache_getset,
};

static PyObject *mod_policies(PyObject *self, PyObject *args)
{
	const char *names[256];
	int include_loaded = 0, n, i;

	if (!PyArg_ParseTuple(args, "|p", &include_loaded))
		return NULL;
	n = cp_policy_names(names, 256, include_loaded);
	PyObject *list = PyList_New(0);

	for (i = 0; list && i < n && i < 256; i++) {
		PyObject *s = PyUnicode_FromString(names[i]);

		if (!s || PyList_Append(list, s)) {
			Py_XDECREF(s);
			Py_DECREF(list);
			return NULL;
		}
		Py_DECREF(s);
	}
	return list;
}

/* Whether a policy has an admit_folio hook: without one every miss is
 * cached, so until its cache first fills, what hits depends on the
 * stream alone (models/runtime.py's MiniSim defers such caches). */
static PyObject *mod_admits(PyObject *self, PyObject *args)
{
	const struct cp_policy_file *file;
	const char *name, *reg_name;

	if (!PyArg_ParseTuple(args, "s", &name))
		return NULL;
	file = cp_find_policy(name, &reg_name);
	if (!file) {
		PyErr_Format(PyExc_ValueError, "unknown policy %s", name);
		return NULL;
	}
	return PyBool_FromLong(file->ops->admit_folio != NULL);
}

/* Load a policy built as its own shared object; returns its name.  The
 * object stays loaded for the life of the process. */
static PyObject *mod_load_library(PyObject *self, PyObject *args)
{
	struct cp_policy_file *(*entry)(void);
	struct cp_policy_file *file;
	const char *path, *tag, *name;
	void *handle;

	if (!PyArg_ParseTuple(args, "ss", &path, &tag))
		return NULL;
	handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		PyErr_Format(PyExc_ValueError, "cannot load %s: %s", path,
			     dlerror());
		return NULL;
	}
	*(void **)&entry = dlsym(handle, "cp_policy_entry");
	file = entry ? entry() : NULL;
	if (!file || !file->ops) {
		dlclose(handle);
		PyErr_Format(PyExc_ValueError,
			     "%s defines no policy (CP_POLICY missing)", path);
		return NULL;
	}
	name = cp_load_policy_file(file, tag);
	if (!name)
		return PyErr_NoMemory();
	return PyUnicode_FromString(name);
}

/* Indices of the keys that SHARDS keeps: cp_hash64(key) < threshold. */
static PyObject *mod_sample_index(PyObject *self, PyObject *args)
{
	unsigned long long threshold;
	PyObject *keys_obj, *out;
	Py_buffer keys;
	__u64 n, i, kept = 0, *idx;
	const __u64 *k;

	if (!PyArg_ParseTuple(args, "OK", &keys_obj, &threshold))
		return NULL;
	if (get_u64_buffer(keys_obj, &keys, "keys", 8) < 0)
		return NULL;
	n = keys.len / 8;
	k = keys.buf;
	idx = PyMem_Malloc(n ? n * 8 : 8);
	if (!idx) {
		PyBuffer_Release(&keys);
		return PyErr_NoMemory();
	}
	Py_BEGIN_ALLOW_THREADS
	for (i = 0; i < n; i++)
		if (cp_sampled(k[i], threshold))
			idx[kept++] = i;
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&keys);
	out = PyBytes_FromStringAndSize((const char *)idx, kept * 8);
	PyMem_Free(idx);
	return out;
}

static PyMethodDef module_methods[] = {
	{ "sample_index", mod_sample_index, METH_VARARGS,
	  "sample_index(keys_u64_buffer, threshold) -> u64 index bytes" },
	{ "policies", mod_policies, METH_VARARGS,
	  "policies(include_loaded=False) -> registered policy names" },
	{ "admits", mod_admits, METH_VARARGS,
	  "admits(name) -> whether the policy has an admit_folio hook" },
	{ "load_library", mod_load_library, METH_VARARGS,
	  "load_library(path, tag) -> registered policy name" },
	{ NULL }
};

static struct PyModuleDef runtime_module =
	CP_MODULE_DEF("_runtime", "cache_ext policy runtime (native)", module_methods);

PyMODINIT_FUNC PyInit__runtime(void)
{
	return cp_module_with_type(&runtime_module, &CacheType, "Cache");
}
