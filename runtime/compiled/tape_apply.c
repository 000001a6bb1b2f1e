/* The CUDA tape's op call, compiled, for arguments it has run before (convgen.host_path).

   An op call on the CUDA tape repeats, for the same arguments, the same checks, allocations and launches; in
   Python they cost more than the GPU work of a tiny op. host_path.py keeps, for each call it ran and accepted, an
   entry: the arguments, the inputs' recorded shapes and the forward's launch program. `TapeApply` is the tape's
   `_apply`: where the call's arguments are an entry's, exactly (types too), it checks the input nodes, replays the
   program and records the node here; anything else, and anything that fails on the way (an allocation, a launch),
   is the Python path's, which computes it from the start and gives the error its text. */

#include "host_path.h"

#include <stddef.h>

/* An entry's fields, in the order host_path.py's ENTRY_FIELDS names them. */
enum {
    E_ARGS, E_DEVICE, E_DIMS, E_NUMELS, E_READS, E_INFO, E_GEOM, E_SHAPE, E_NAME, E_PROGRAM, E_CURRENT_DEVICE,
    E_STREAM, E_FIELDS
};

static PyObject *s_backend, *s_nodes, *s_count, *s_size, *s_value, *s_error;

typedef struct {
    PyObject_HEAD
    PyObject *fallback;  /* the Python path: fallback(tape, info, ids, check, args) */
    PyObject *calls;     /* backend -> check -> args -> entry */
    PyTypeObject *node_type, *record_type, *result_type;
    vectorcallfunc vectorcall;
} TapeApply;

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

/* The node of the replayed call appended to `*nodes` (the tape's list, or a copy of its first `count` nodes) and the
   call's Result (new reference), or NULL. */
static PyObject *recorded(TapeApply *self, PyObject *tape, PyObject *backend, PyObject **nodes, Py_ssize_t count,
                          PyObject *info, PyObject *ids, PyObject *entry, PyObject *output, PyObject *saved) {
    PyObject *info_geom_saved[] = {Py_NewRef(info), Py_NewRef(PyTuple_GET_ITEM(entry, E_GEOM)), saved};
    PyObject *record = named_tuple(self->record_type, 3, info_geom_saved);
    if (record == NULL) { Py_DECREF(output); return NULL; }
    PyObject *shape = PyTuple_GET_ITEM(entry, E_SHAPE);
    PyObject *fields[] = {output, Py_NewRef(shape), Py_NewRef(shape), Py_NewRef(PyTuple_GET_ITEM(entry, E_NAME)),
                          Py_NewRef(Py_True), Py_NewRef(ids), record};
    PyObject *node = named_tuple(self->node_type, 7, fields);
    if (node == NULL) return NULL;
    if (PyList_GET_SIZE(*nodes) != count) {  /* an older tape: its own prefix, as _append copies it */
        PyObject *prefix = PyList_GetSlice(*nodes, 0, count);
        if (prefix == NULL) { Py_DECREF(node); return NULL; }
        Py_SETREF(*nodes, prefix);
    }
    int appended = PyList_Append(*nodes, node);
    Py_DECREF(node);
    if (appended < 0) return NULL;

    PyObject *result = NULL;
    PyTypeObject *tape_type = Py_TYPE(tape);
    PyObject *new_tape = tape_type->tp_alloc(tape_type, 0);
    PyObject *new_count = PyLong_FromSsize_t(count + 1), *id = PyLong_FromSsize_t(count);
    PyObject *pair = new_tape && new_count && id ? PyTuple_Pack(2, new_tape, id) : NULL;
    if (pair && PyObject_SetAttr(new_tape, s_backend, backend) == 0 && PyObject_SetAttr(new_tape, s_nodes, *nodes) == 0
        && PyObject_SetAttr(new_tape, s_count, new_count) == 0) {
        result = self->result_type->tp_alloc(self->result_type, 0);
        if (result && (PyObject_SetAttr(result, s_value, pair) < 0 || PyObject_SetAttr(result, s_error, Py_None) < 0))
            Py_CLEAR(result);
    }
    Py_XDECREF(pair); Py_XDECREF(new_tape); Py_XDECREF(new_count); Py_XDECREF(id);
    if (result == NULL) {  /* the node went on the list: take it off again, for the Python path to record */
        Py_ssize_t size = PyList_GET_SIZE(*nodes);
        if (size > count) PyList_SetSlice(*nodes, count, size, NULL);
    }
    return result;
}

/* The call replayed: its Result (new reference), or NULL where the Python path takes it (with an exception set
   only when something failed). */
static PyObject *replayed(TapeApply *self, PyObject *tape, PyObject *info, PyObject *ids, PyObject *check,
                          PyObject *args) {
    PyObject *backend = PyObject_GetAttr(tape, s_backend);
    if (backend == NULL) return NULL;
    PyObject *entry = entry_of(self, backend, check, args);  /* held to the end: a callback may drop the cache */
    PyObject *nodes = NULL, *given[MAX_VALUES], *arrays[MAX_VALUES], *result = NULL;
    Replay replay = {.made_count = 0};
    uint64_t addresses[MAX_VALUES], stream = 0, device = 0;
    if (entry == NULL) goto done;

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
        given[i] = PyTuple_GET_ITEM(node, 0);  /* the node's array, held by the list held here */
        uint64_t size, numel;
        if (read_u64(given[i], s_size, &size) < 0) goto done;
        if (read_u64(PyTuple_GET_ITEM(numels, i), NULL, &numel) < 0 || size != numel) goto done;
        if (array_address(given[i], &addresses[i]) < 0) goto done;
    }
    PyObject *reads = PyTuple_GET_ITEM(entry, E_READS);
    for (Py_ssize_t i = 0; i < inputs; i++) {  /* in the program's order of its inputs */
        Py_ssize_t read = PyLong_AsSsize_t(PyTuple_GET_ITEM(reads, i));
        if (read < 0 || read >= inputs) goto done;
        replay.values[i] = addresses[read];
        arrays[i] = given[read];
    }

    PyObject *stream_object = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, E_STREAM));
    if (stream_object == NULL) goto done;
    int stream_status = read_u64(stream_object, PyLong_Check(stream_object) ? NULL : s_ptr, &stream);
    Py_DECREF(stream_object);
    if (stream_status < 0) goto done;

    PyObject *program = PyTuple_GET_ITEM(entry, E_PROGRAM);
    if (replay_program(program, arrays, inputs, stream, &replay) < 0) goto done;
    PyObject *output = replay_returned(program, 0, &replay);
    PyObject *saved = output ? replay_returned(program, 1, &replay) : NULL;
    if (saved == NULL) { Py_XDECREF(output); goto done; }
    result = recorded(self, tape, backend, &nodes, count, info, ids, entry, output, saved);

done:
    replay_release(&replay);
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

PyTypeObject TapeApplyType = {
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

int tape_entry_fields(void) { return E_FIELDS; }

#define INTERN(variable, text) if ((variable = PyUnicode_InternFromString(text)) == NULL) return -1

int tape_apply_names(void) {
    INTERN(s_backend, "_backend");
    INTERN(s_nodes, "_nodes");
    INTERN(s_count, "_count");
    INTERN(s_size, "size");
    INTERN(s_value, "_value");
    INTERN(s_error, "error");
    return 0;
}
