/* convgen._host_path: the CUDA tape's op call, compiled, for arguments it has run before.

   An op call on the CUDA tape repeats, for the same arguments, the same checks, allocations and launches; in
   Python they cost more than the GPU work of a tiny op. convgen/host_path.py keeps, for each call it ran and
   accepted, an entry: the arguments, the inputs' recorded shapes, the forward's launch program (what it makes
   and launches, in order) and the callables it makes and launches with. `TapeApply` is the tape's `_apply`:
   where the call's arguments are an entry's, exactly (types too), it checks the input nodes, replays the
   program and records the node here; anything else, and anything that fails on the way (an allocation, a
   launch), is the Python path's, which computes it from the start and gives the error its text. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_SLOTS 64   /* a launch's parameters; host_path.py makes no entry for more */
#define MAX_VALUES 64  /* a program's addresses: its inputs, its scratch base, what it makes */

/* An entry's fields, in the order host_path.py's ENTRY_FIELDS names them. */
enum {
    E_ARGS, E_DEVICE, E_DIMS, E_NUMELS, E_READS, E_INFO, E_GEOM, E_SHAPE, E_NAME, E_BASE_SIZE, E_STEPS, E_RETURNS,
    E_CURRENT_DEVICE, E_STREAM, E_LAUNCH, E_SCRATCH, E_FIELDS
};
/* A step's first item. */
enum { STEP_OUTPUT = 0, STEP_SCRATCH = 1, STEP_LAUNCH = 2 };

static PyObject *s_backend, *s_nodes, *s_count, *s_data, *s_ptr, *s_size, *s_value, *s_error;

typedef struct {
    PyObject_HEAD
    PyObject *fallback;  /* the Python path: fallback(tape, info, ids, check, args) */
    PyObject *calls;     /* backend -> check -> args -> entry */
    PyTypeObject *node_type, *record_type, *result_type;
    vectorcallfunc vectorcall;
} TapeApply;

/* Whether `a` (an entry's argument) and `b` are the same value of the same exact type: 1 == True == 1.0 and
   -0.0 == 0.0 to Python's equality, which keyed the lookup, but not here. */
static int exact_same(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    PyTypeObject *type = Py_TYPE(a);
    if (Py_TYPE(b) != type) return 0;
    if (type == &PyTuple_Type) {
        Py_ssize_t n = PyTuple_GET_SIZE(a);
        if (PyTuple_GET_SIZE(b) != n) return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!exact_same(PyTuple_GET_ITEM(a, i), PyTuple_GET_ITEM(b, i))) return 0;
        return 1;
    }
    if (type == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (type == &PyLong_Type || type == &PyUnicode_Type) {
        int equal = PyObject_RichCompareBool(a, b, Py_EQ);
        if (equal < 0) PyErr_Clear();
        return equal == 1;
    }
    return 0;
}

/* An unsigned 64-bit value of an int, or of the attribute `name` of `object` (NULL: the object itself);
   -1 with an exception set when it has none. */
static int read_u64(PyObject *object, PyObject *name, uint64_t *out) {
    PyObject *value = name ? PyObject_GetAttr(object, name) : (Py_INCREF(object), object);
    if (value == NULL) return -1;
    unsigned long long bits = PyLong_AsUnsignedLongLongMask(value);
    Py_DECREF(value);
    if (bits == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)bits;
    return 0;
}

/* An array's device address: array.data.ptr. */
static int array_address(PyObject *array, uint64_t *out) {
    PyObject *data = PyObject_GetAttr(array, s_data);
    if (data == NULL) return -1;
    int status = read_u64(data, s_ptr, out);
    Py_DECREF(data);
    return status;
}

/* `made` picked by a program's return index: None, an index, or a tuple of them (new reference). */
static PyObject *picked(PyObject *index, PyObject **made, Py_ssize_t count) {
    if (index == Py_None) Py_RETURN_NONE;
    if (PyTuple_CheckExact(index)) {
        Py_ssize_t n = PyTuple_GET_SIZE(index);
        PyObject *tuple = PyTuple_New(n);
        if (tuple == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = picked(PyTuple_GET_ITEM(index, i), made, count);
            if (item == NULL) { Py_DECREF(tuple); return NULL; }
            PyTuple_SET_ITEM(tuple, i, item);
        }
        return tuple;
    }
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i < 0 || i >= count) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a program returns what it did not make");
        return NULL;
    }
    Py_INCREF(made[i]);
    return made[i];
}

/* A tuple of `type` (a NamedTuple's class) holding `n` new references. */
static PyObject *named_tuple(PyTypeObject *type, Py_ssize_t n, PyObject **items) {
    PyObject *tuple = type->tp_alloc(type, n);
    if (tuple == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(tuple, i, items[i]);
    return tuple;
}

/* One launch step: (STEP_LAUNCH, function, grid, block, shared bytes, constants as 8-byte slots, holes as a flat
   tuple of (slot, address index) pairs); each hole adds its address to its slot. */
static int launch(PyObject *step, PyObject *launch_kernel, uint64_t stream, const uint64_t *values,
                  Py_ssize_t value_count) {
    uint64_t slots[MAX_SLOTS];
    void *pointers[MAX_SLOTS];
    PyObject *constants = PyTuple_GET_ITEM(step, 5), *holes = PyTuple_GET_ITEM(step, 6);
    Py_ssize_t bytes = PyBytes_GET_SIZE(constants), count = bytes / 8;
    if (count > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "a launch with more parameters than the host path holds");
        return -1;
    }
    memcpy(slots, PyBytes_AS_STRING(constants), (size_t)bytes);
    Py_ssize_t hole_items = PyTuple_GET_SIZE(holes);
    for (Py_ssize_t i = 0; i + 1 < hole_items; i += 2) {
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(holes, i));
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(holes, i + 1));
        if (slot < 0 || slot >= count || index < 0 || index >= value_count) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a launch's hole outside its program");
            return -1;
        }
        slots[slot] += values[index];
    }
    for (Py_ssize_t i = 0; i < count; i++) pointers[i] = &slots[i];
    PyObject *one = PyLong_FromLong(1), *zero = PyLong_FromLong(0);
    PyObject *stream_object = PyLong_FromUnsignedLongLong(stream);
    PyObject *parameters = PyLong_FromVoidPtr((void *)pointers);
    PyObject *result = NULL;
    if (one && zero && stream_object && parameters) {
        PyObject *args[] = {PyTuple_GET_ITEM(step, 1), PyTuple_GET_ITEM(step, 2), one, one,
                            PyTuple_GET_ITEM(step, 3), one, one, PyTuple_GET_ITEM(step, 4), stream_object,
                            parameters, zero};
        result = PyObject_Vectorcall(launch_kernel, args, 11, NULL);
    }
    Py_XDECREF(one); Py_XDECREF(zero); Py_XDECREF(stream_object); Py_XDECREF(parameters);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

/* The entry of this call (a new reference), or NULL (no exception) when there is none. The dicts are held while
   they are searched: an argument's __eq__ may run Python, and another thread may clear the cache meanwhile. */
static PyObject *entry_of(TapeApply *self, PyObject *backend, PyObject *check, PyObject *args) {
    PyObject *by_check = Py_XNewRef(PyDict_GetItemWithError(self->calls, backend));
    PyObject *by_args = by_check && PyDict_CheckExact(by_check) ? Py_XNewRef(PyDict_GetItemWithError(by_check, check))
                                                                : NULL;
    PyObject *entry = by_args && PyDict_CheckExact(by_args) ? Py_XNewRef(PyDict_GetItemWithError(by_args, args)) : NULL;
    Py_XDECREF(by_args);
    Py_XDECREF(by_check);
    if (PyErr_Occurred()) PyErr_Clear();  /* an argument without a hash: no entry */
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == E_FIELDS
        && exact_same(PyTuple_GET_ITEM(entry, E_ARGS), args))
        return entry;
    Py_XDECREF(entry);
    return NULL;
}

/* The call replayed: its Result (new reference), or NULL where the Python path takes it (with an exception set
   only when something failed). */
static PyObject *replayed(TapeApply *self, PyObject *tape, PyObject *info, PyObject *ids, PyObject *check,
                          PyObject *args) {
    PyObject *backend = PyObject_GetAttr(tape, s_backend);
    if (backend == NULL) return NULL;
    PyObject *entry = entry_of(self, backend, check, args);
    PyObject *nodes = NULL, *made[MAX_VALUES], *kept = NULL, *result = NULL;
    Py_ssize_t made_count = 0;
    uint64_t values[MAX_VALUES], addresses[MAX_VALUES], stream = 0, device = 0;
    if (entry == NULL) goto done;  /* held to the end: a callback below may drop the cache */

    PyObject *dims = PyTuple_GET_ITEM(entry, E_DIMS), *numels = PyTuple_GET_ITEM(entry, E_NUMELS);
    Py_ssize_t inputs = PyTuple_GET_SIZE(dims);
    if (!PyTuple_CheckExact(ids) || PyTuple_GET_SIZE(ids) != inputs || inputs >= MAX_VALUES) goto done;
    PyObject *current = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, E_CURRENT_DEVICE));
    if (current == NULL || read_u64(current, NULL, &device) < 0) { Py_XDECREF(current); goto done; }
    Py_DECREF(current);
    uint64_t entry_device;
    if (read_u64(PyTuple_GET_ITEM(entry, E_DEVICE), NULL, &entry_device) < 0 || device != entry_device) goto done;

    nodes = PyObject_GetAttr(tape, s_nodes);
    PyObject *count_object = PyObject_GetAttr(tape, s_count);
    Py_ssize_t count = count_object && PyLong_CheckExact(count_object) ? PyLong_AsSsize_t(count_object) : -1;
    Py_XDECREF(count_object);
    if (nodes == NULL || !PyList_CheckExact(nodes) || count < 0 || count > PyList_GET_SIZE(nodes)) goto done;
    for (Py_ssize_t i = 0; i < inputs; i++) {  /* the checks of tape.py's _read, passed */
        PyObject *id = PyTuple_GET_ITEM(ids, i);
        if (!PyLong_CheckExact(id)) goto done;
        Py_ssize_t index = PyLong_AsSsize_t(id);
        if (index < 0 || index >= count) goto done;
        PyObject *node = PyList_GET_ITEM(nodes, index);
        if (!PyTuple_Check(node) || PyTuple_GET_SIZE(node) < 3) goto done;
        if (PyObject_RichCompareBool(PyTuple_GET_ITEM(node, 2), PyTuple_GET_ITEM(dims, i), Py_EQ) != 1) goto done;
        uint64_t size;
        if (read_u64(PyTuple_GET_ITEM(node, 0), s_size, &size) < 0) goto done;
        uint64_t numel;
        if (read_u64(PyTuple_GET_ITEM(numels, i), NULL, &numel) < 0 || size != numel) goto done;
        if (array_address(PyTuple_GET_ITEM(node, 0), &addresses[i]) < 0) goto done;
    }
    for (Py_ssize_t i = 0; i < inputs; i++) {  /* in the program's order of its inputs */
        Py_ssize_t read = PyLong_AsSsize_t(PyTuple_GET_ITEM(PyTuple_GET_ITEM(entry, E_READS), i));
        if (read < 0 || read >= inputs) goto done;
        values[i] = addresses[read];
    }

    PyObject *stream_object = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, E_STREAM));
    if (stream_object == NULL) goto done;
    int stream_status = read_u64(stream_object, PyLong_Check(stream_object) ? NULL : s_ptr, &stream);
    Py_DECREF(stream_object);
    if (stream_status < 0) goto done;

    /* The program: its scratch base (held until its launches are queued), then its steps in order. */
    Py_ssize_t value_count = inputs + 1;
    values[inputs] = 0;
    PyObject *base_size = PyTuple_GET_ITEM(entry, E_BASE_SIZE);
    if (PyObject_IsTrue(base_size)) {
        kept = PyObject_CallOneArg(PyTuple_GET_ITEM(entry, E_SCRATCH), base_size);
        if (kept == NULL || read_u64(kept, s_ptr, &values[inputs]) < 0) goto done;
    }
    PyObject *steps = PyTuple_GET_ITEM(entry, E_STEPS), *launch_kernel = PyTuple_GET_ITEM(entry, E_LAUNCH);
    for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(steps); s++) {
        PyObject *step = PyTuple_GET_ITEM(steps, s);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(step, 0));
        if (kind == STEP_LAUNCH) {
            if (launch(step, launch_kernel, stream, values, value_count) < 0) goto done;
            continue;
        }
        if (value_count >= MAX_VALUES) goto done;
        PyObject *object = PyObject_Call(PyTuple_GET_ITEM(step, 1), PyTuple_GET_ITEM(step, 2), NULL);
        if (object == NULL) goto done;
        made[made_count++] = object;
        int status = kind == STEP_OUTPUT ? array_address(object, &values[value_count])
                                         : read_u64(object, s_ptr, &values[value_count]);
        if (status < 0) goto done;
        value_count++;
    }

    /* The node, as tape.py's _apply and _append record it. */
    PyObject *returns = PyTuple_GET_ITEM(entry, E_RETURNS);
    PyObject *output = picked(PyTuple_GET_ITEM(returns, 0), made, made_count);
    PyObject *saved = output ? picked(PyTuple_GET_ITEM(returns, 1), made, made_count) : NULL;
    if (saved == NULL) { Py_XDECREF(output); goto done; }
    PyObject *info_geom_saved[] = {Py_NewRef(info), Py_NewRef(PyTuple_GET_ITEM(entry, E_GEOM)), saved};
    PyObject *record = named_tuple(self->record_type, 3, info_geom_saved);
    if (record == NULL) { Py_DECREF(output); goto done; }
    PyObject *shape = PyTuple_GET_ITEM(entry, E_SHAPE);
    PyObject *fields[] = {output, Py_NewRef(shape), Py_NewRef(shape), Py_NewRef(PyTuple_GET_ITEM(entry, E_NAME)),
                          Py_NewRef(Py_True), Py_NewRef(ids), record};
    PyObject *node = named_tuple(self->node_type, 7, fields);
    if (node == NULL) goto done;
    if (PyList_GET_SIZE(nodes) != count) {  /* an older tape: its own prefix, as _append copies it */
        PyObject *prefix = PyList_GetSlice(nodes, 0, count);
        if (prefix == NULL) { Py_DECREF(node); goto done; }
        Py_SETREF(nodes, prefix);
    }
    int appended = PyList_Append(nodes, node);
    Py_DECREF(node);
    if (appended < 0) goto done;

    PyTypeObject *tape_type = Py_TYPE(tape);
    PyObject *new_tape = tape_type->tp_alloc(tape_type, 0);
    PyObject *new_count = PyLong_FromSsize_t(count + 1), *id = PyLong_FromSsize_t(count);
    PyObject *pair = new_tape && new_count && id ? PyTuple_Pack(2, new_tape, id) : NULL;
    if (pair && PyObject_SetAttr(new_tape, s_backend, backend) == 0 && PyObject_SetAttr(new_tape, s_nodes, nodes) == 0
        && PyObject_SetAttr(new_tape, s_count, new_count) == 0) {
        result = self->result_type->tp_alloc(self->result_type, 0);
        if (result && (PyObject_SetAttr(result, s_value, pair) < 0 || PyObject_SetAttr(result, s_error, Py_None) < 0))
            Py_CLEAR(result);
    }
    Py_XDECREF(pair); Py_XDECREF(new_tape); Py_XDECREF(new_count); Py_XDECREF(id);
    if (result == NULL) {  /* the node went on the list: take it off again, for the Python path to record */
        Py_ssize_t size = PyList_GET_SIZE(nodes);
        if (size > count) PyList_SetSlice(nodes, count, size, NULL);
    }

done:
    for (Py_ssize_t i = 0; i < made_count; i++) Py_DECREF(made[i]);
    Py_XDECREF(kept);
    Py_XDECREF(nodes);
    Py_XDECREF(entry);
    Py_DECREF(backend);
    return result;
}

static PyObject *tape_apply_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    TapeApply *self = (TapeApply *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 5 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "_apply takes (tape, info, ids, check, args)");
        return NULL;
    }
    PyObject *result = replayed(self, args[0], args[1], args[2], args[3], args[4]);
    if (result != NULL) return result;
    PyErr_Clear();  /* the Python path computes the call again, and says what failed */
    return PyObject_Vectorcall(self->fallback, args, 5, NULL);
}

static PyObject *tape_apply_get(PyObject *self, PyObject *tape, PyObject *type) {
    if (tape == NULL || tape == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, tape);
}

static int tape_apply_init(TapeApply *self, PyObject *args, PyObject *kwargs) {
    PyObject *fallback, *calls, *node_type, *record_type, *result_type;
    static char *names[] = {"fallback", "calls", "node_type", "record_type", "result_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!O!O!", names, &fallback, &PyDict_Type, &calls,
                                     &PyType_Type, &node_type, &PyType_Type, &record_type, &PyType_Type,
                                     &result_type))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)node_type, &PyTuple_Type)
        || !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "TapeApply: the node and record types must be tuples");
        return -1;
    }
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->calls, Py_NewRef(calls));
    Py_XSETREF(self->node_type, (PyTypeObject *)Py_NewRef(node_type));
    Py_XSETREF(self->record_type, (PyTypeObject *)Py_NewRef(record_type));
    Py_XSETREF(self->result_type, (PyTypeObject *)Py_NewRef(result_type));
    self->vectorcall = tape_apply_call;
    return 0;
}

static int tape_apply_traverse(TapeApply *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    Py_VISIT(self->calls);
    Py_VISIT(self->node_type);
    Py_VISIT(self->record_type);
    Py_VISIT(self->result_type);
    return 0;
}

static int tape_apply_clear(TapeApply *self) {
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->calls);
    Py_CLEAR(self->node_type);
    Py_CLEAR(self->record_type);
    Py_CLEAR(self->result_type);
    return 0;
}

static void tape_apply_dealloc(TapeApply *self) {
    PyObject_GC_UnTrack(self);
    tape_apply_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TapeApplyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "convgen._host_path.TapeApply",
    .tp_doc = "A tape's _apply: a call whose arguments host_path.py remembered, replayed here; any other, the "
              "Python path's.",
    .tp_basicsize = sizeof(TapeApply),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tape_apply_init,
    .tp_dealloc = (destructor)tape_apply_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)tape_apply_traverse,
    .tp_clear = (inquiry)tape_apply_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TapeApply, vectorcall),
    .tp_descr_get = tape_apply_get,
};

static struct PyModuleDef host_path_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "convgen._host_path",
    .m_doc = "The CUDA tape's op call, compiled, for arguments it has run before (convgen.host_path).",
    .m_size = -1,
};

#define INTERN(variable, text) if ((variable = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__host_path(void) {
    INTERN(s_backend, "_backend");
    INTERN(s_nodes, "_nodes");
    INTERN(s_count, "_count");
    INTERN(s_data, "data");
    INTERN(s_ptr, "ptr");
    INTERN(s_size, "size");
    INTERN(s_value, "_value");
    INTERN(s_error, "error");
    if (PyType_Ready(&TapeApplyType) < 0) return NULL;
    PyObject *module = PyModule_Create(&host_path_module);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "TapeApply", (PyObject *)&TapeApplyType) < 0
        || PyModule_AddIntConstant(module, "MAX_SLOTS", MAX_SLOTS) < 0
        || PyModule_AddIntConstant(module, "MAX_VALUES", MAX_VALUES) < 0
        || PyModule_AddIntConstant(module, "ENTRY_FIELDS", E_FIELDS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
