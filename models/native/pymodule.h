/* The one way cachepilot's extension modules come to life: define the
 * module (CP_MODULE_DEF), ready its type, create the module and publish
 * the type under its name.  Both extensions (_mrc, _runtime) are a
 * handful of functions around one type, so this is all their PyInit has
 * in common; each adds its constants after. */
#ifndef CP_PYMODULE_H
#define CP_PYMODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A module definition: single-phase initialisation with no per-module
 * state (m_size -1), as both extensions keep none. */
#define CP_MODULE_DEF(name, doc, methods)				\
	{								\
		PyModuleDef_HEAD_INIT,					\
		.m_name = (name),					\
		.m_doc = (doc),						\
		.m_size = -1,						\
		.m_methods = (methods),					\
	}

/* The module of `def`, with `type` as attribute `name`; NULL with an
 * exception set on failure. */
static inline PyObject *cp_module_with_type(PyModuleDef *def, PyTypeObject *type,
					    const char *name)
{
	PyObject *m;

	if (PyType_Ready(type) < 0)
		return NULL;
	m = PyModule_Create(def);
	if (!m)
		return NULL;
	Py_INCREF(type);
	if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
		Py_DECREF(type);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}

#endif
