/* convgen.torch's eager op call, compiled, for arguments it has run before on CUDA tensors (convgen.torch.host_path).

   `EagerCall` is a functional op (conv, conv_transpose, a pool) in eager mode, or the conv families' backward:
   called with every argument, in the op's order, tensors first. Where the key (the tensors' shapes, the first one's
   dtype and device, the other keyed arguments) is an entry's, exactly (types too), and the tensors are as the
   entry's program reads them (each its dtype, the device, strided, contiguous, aligned), no torch.func transform or
   autocast is active, and torch's precision setting and current device are the entry's, it replays the launch
   program on torch's current stream with its outputs from torch's allocator. A forward then attaches the backward as
   the Python path does (functional.py's _Eager) where autograd will want one; a backward returns its gradients.
   Anything else, and anything that fails on the way, is the Python path's, which computes the call from the start
   and raises its error. */

#include "host_path.h"

#include <stddef.h>

/* An entry's fields, in the order convgen.torch.host_path's ENTRY_FIELDS names them. */
enum {
    E_KEY, E_DTYPES, E_DEVICE, E_CURRENT, E_CURRENT_DEVICE, E_STREAM, E_PRECISION, E_FIXED, E_READS, E_PROGRAM,
    E_APPLY_HEAD, E_ORDER, E_FIELDS
};
#define MAX_TENSORS 8

static PyObject *s_shape, *s_dtype, *s_layout, *s_is_nested, *s_get_device, *s_is_contiguous, *s_data_ptr,
    *s_requires_grad;

typedef struct {
    PyObject_HEAD
    PyObject *fallback;      /* the Python path, called with the op's arguments */
    PyObject *calls;         /* (tensor shapes, *other keyed arguments) -> entry */
    Py_ssize_t tensors, arguments, keyed;  /* the first `keyed` arguments key an entry; the rest only the fallback's */
    PyObject *tensor_types;  /* the exact types a tensor argument may have (torch.Tensor, torch.nn.Parameter) */
    PyObject *strided;       /* torch.strided */
    uint64_t alignment;      /* of every address a kernel reads */
    PyObject *transforms_active, *autocast_active, *precision_of, *grad_enabled;
    PyObject *apply;         /* None: the call returns what the program returns, as a tuple (a backward) */
    vectorcallfunc vectorcall;
} EagerCall;

/* Whether calling `function` (None: nothing to ask) returns False; -1 with an exception set where it fails. */
static int says_false(PyObject *function) {
    if (function == Py_None) return 1;
    PyObject *answer = PyObject_CallNoArgs(function);
    if (answer == NULL) return -1;
    int is_false = answer == Py_False;
    Py_DECREF(answer);
    return is_false;
}

/* Whether `tensor` is as the entry's program reads it: of `dtype`, strided and not nested, on `device`, contiguous,
   its address (into `*address`) on the kernels' alignment. 1, 0, or -1 with an exception set. */
static int as_read(EagerCall *self, PyObject *tensor, PyObject *dtype, long device, uint64_t *address) {
    PyObject *value = PyObject_GetAttr(tensor, s_dtype);
    if (value == NULL) return -1;
    int ok = value == dtype;
    Py_DECREF(value);
    if (!ok) return 0;
    if ((value = PyObject_GetAttr(tensor, s_layout)) == NULL) return -1;
    ok = value == self->strided;
    Py_DECREF(value);
    if (!ok) return 0;
    if ((value = PyObject_GetAttr(tensor, s_is_nested)) == NULL) return -1;
    ok = value == Py_False;
    Py_DECREF(value);
    if (!ok) return 0;
    if ((value = PyObject_CallMethodNoArgs(tensor, s_get_device)) == NULL) return -1;
    long on = PyLong_AsLong(value);
    Py_DECREF(value);
    if (on == -1 && PyErr_Occurred()) return -1;
    if (on != device) return 0;
    if ((value = PyObject_CallMethodNoArgs(tensor, s_is_contiguous)) == NULL) return -1;
    ok = value == Py_True;
    Py_DECREF(value);
    if (!ok) return 0;
    if ((value = PyObject_CallMethodNoArgs(tensor, s_data_ptr)) == NULL) return -1;
    int status = read_u64(value, NULL, address);
    Py_DECREF(value);
    if (status < 0) return -1;
    return *address % self->alignment == 0;
}

/* The entry of the call (a new reference) and its tensors' addresses, or NULL (with an exception set only where
   something failed). The key: the tensors' shapes (None for a missing one), the first tensor's dtype and device
   index, then the other keyed arguments. The dict is held while it is searched: a key's __eq__ may run Python. */
static PyObject *entry_of(EagerCall *self, PyObject *const *args, uint64_t *addresses) {
    if (PySequence_Contains(self->tensor_types, (PyObject *)Py_TYPE(args[0])) != 1) return NULL;
    PyObject *key = PyTuple_New(self->keyed + 2);
    if (key == NULL) return NULL;
    PyObject *dtype = PyObject_GetAttr(args[0], s_dtype);
    PyObject *on = dtype ? PyObject_CallMethodNoArgs(args[0], s_get_device) : NULL;
    if (on == NULL) { Py_XDECREF(dtype); Py_DECREF(key); return NULL; }
    PyTuple_SET_ITEM(key, self->tensors, dtype);
    PyTuple_SET_ITEM(key, self->tensors + 1, on);
    for (Py_ssize_t i = 0; i < self->keyed; i++) {
        PyObject *arg = args[i], *item;
        if (i < self->tensors && arg != Py_None) {
            if (PySequence_Contains(self->tensor_types, (PyObject *)Py_TYPE(arg)) != 1) { Py_DECREF(key); return NULL; }
            if ((item = PyObject_GetAttr(arg, s_shape)) == NULL) { Py_DECREF(key); return NULL; }
        } else {
            item = Py_NewRef(arg);
        }
        PyTuple_SET_ITEM(key, i < self->tensors ? i : i + 2, item);
    }
    PyObject *calls = Py_NewRef(self->calls);
    PyObject *entry = Py_XNewRef(PyDict_GetItemWithError(calls, key));
    Py_DECREF(calls);
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != E_FIELDS
        || !exact_same(PyTuple_GET_ITEM(entry, E_KEY), key)) {
        Py_DECREF(key);
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(key);
    long device = PyLong_AsLong(PyTuple_GET_ITEM(entry, E_DEVICE));
    PyObject *dtypes = PyTuple_GET_ITEM(entry, E_DTYPES);  /* one a tensor: a pool's kept state may be of another */
    if (!PyTuple_CheckExact(dtypes) || PyTuple_GET_SIZE(dtypes) != self->tensors) {
        Py_DECREF(entry);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < self->tensors; i++) {
        addresses[i] = 0;
        if (args[i] != Py_None && as_read(self, args[i], PyTuple_GET_ITEM(dtypes, i), device, &addresses[i]) != 1) {
            Py_DECREF(entry);
            return NULL;
        }
    }
    return entry;
}

/* Whether the state around the call is the entry's: no torch.func transform or autocast, the precision torch's
   setting gives the first tensor's dtype, the current device the one the entry ran on. 1, 0, or -1. */
static int state_is_entrys(EagerCall *self, PyObject *entry) {
    int status = says_false(self->transforms_active);
    if (status == 1) status = says_false(self->autocast_active);
    if (status == 1 && self->precision_of != Py_None) {
        PyObject *dtype = PyTuple_GET_ITEM(PyTuple_GET_ITEM(entry, E_DTYPES), 0);  /* entry_of checked the tuple */
        PyObject *precision = PyObject_CallOneArg(self->precision_of, dtype);
        if (precision == NULL) return -1;
        status = PyObject_RichCompareBool(precision, PyTuple_GET_ITEM(entry, E_PRECISION), Py_EQ);
        Py_DECREF(precision);
    }
    if (status == 1) {
        PyObject *current = PyObject_CallNoArgs(PyTuple_GET_ITEM(entry, E_CURRENT_DEVICE));
        if (current == NULL) return -1;
        status = PyObject_RichCompareBool(current, PyTuple_GET_ITEM(entry, E_CURRENT), Py_EQ);
        Py_DECREF(current);
    }
    return status;
}

/* (output, *saved) as the Python path's devices.forward returns them (new reference). */
static PyObject *computed(PyObject *program, Replay *replay) {
    PyObject *output = replay_returned(program, 0, replay);
    PyObject *saved = output ? replay_returned(program, 1, replay) : NULL;
    if (saved == NULL) { Py_XDECREF(output); return NULL; }
    PyObject *tuple;
    if (saved == Py_None) {
        tuple = PyTuple_Pack(1, output);
    } else if (PyTuple_CheckExact(saved)) {
        Py_ssize_t n = PyTuple_GET_SIZE(saved);
        tuple = PyTuple_New(n + 1);
        if (tuple) {
            PyTuple_SET_ITEM(tuple, 0, Py_NewRef(output));
            for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(tuple, i + 1, Py_NewRef(PyTuple_GET_ITEM(saved, i)));
        }
    } else {
        tuple = PyTuple_Pack(2, output, saved);
    }
    Py_DECREF(output);
    Py_DECREF(saved);
    return tuple;
}

/* Every return of the program, as a tuple (new reference). */
static PyObject *all_returned(PyObject *program, Replay *replay) {
    Py_ssize_t n = PyTuple_GET_SIZE(PyTuple_GET_ITEM(program, P_RETURNS));
    PyObject *tuple = PyTuple_New(n);
    for (Py_ssize_t i = 0; tuple && i < n; i++) {
        PyObject *item = replay_returned(program, i, replay);
        if (item == NULL) { Py_CLEAR(tuple); break; }
        PyTuple_SET_ITEM(tuple, i, item);
    }
    return tuple;
}

/* The op's output, with its backward attached where grad mode is on and a tensor requires grad: _Eager's apply with
   (op, geom, precision, computed, *tensors in the backend's order). */
static PyObject *attached(EagerCall *self, PyObject *const *args, PyObject *entry, PyObject *outputs) {
    int no_grad = says_false(self->grad_enabled);
    if (no_grad < 0) return NULL;
    int wanted = 0;
    for (Py_ssize_t i = 0; !no_grad && !wanted && i < self->tensors; i++) {
        if (args[i] == Py_None) continue;
        PyObject *requires = PyObject_GetAttr(args[i], s_requires_grad);
        if (requires == NULL) return NULL;
        wanted = requires == Py_True;
        Py_DECREF(requires);
    }
    if (!wanted) return Py_NewRef(PyTuple_GET_ITEM(outputs, 0));
    PyObject *head = PyTuple_GET_ITEM(entry, E_APPLY_HEAD), *order = PyTuple_GET_ITEM(entry, E_ORDER);
    PyObject *apply_args[3 + 1 + MAX_TENSORS];
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(head); i++) apply_args[count++] = PyTuple_GET_ITEM(head, i);
    apply_args[count++] = outputs;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(order); i++) {
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, i));
        if (index < 0 || index >= self->tensors) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a backend order outside the op's tensors");
            return NULL;
        }
        apply_args[count++] = args[index];
    }
    return PyObject_Vectorcall(self->apply, apply_args, count, NULL);
}

/* The call replayed (new reference), or NULL where the Python path takes it (with an exception set only when
   something failed). */
static PyObject *replayed(EagerCall *self, PyObject *const *args) {
    uint64_t addresses[MAX_TENSORS];
    PyObject *entry = entry_of(self, args, addresses);  /* held to the end: a callback may drop the cache */
    if (entry == NULL) return NULL;
    PyObject *result = NULL, *inputs[MAX_VALUES];
    Replay replay = {.made_count = 0};
    if (state_is_entrys(self, entry) != 1) goto done;
    PyObject *stream_object = PyObject_CallOneArg(PyTuple_GET_ITEM(entry, E_STREAM), PyTuple_GET_ITEM(entry, E_DEVICE));
    uint64_t stream;
    int stream_status = stream_object ? read_u64(stream_object, NULL, &stream) : -1;
    Py_XDECREF(stream_object);
    if (stream_status < 0) goto done;

    PyObject *fixed = PyTuple_GET_ITEM(entry, E_FIXED), *reads = PyTuple_GET_ITEM(entry, E_READS);
    Py_ssize_t count = PyTuple_GET_SIZE(reads);
    if (count >= MAX_VALUES) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {  /* the program's inputs: the op's tensors, then the entry's own */
        Py_ssize_t read = PyLong_AsSsize_t(PyTuple_GET_ITEM(reads, i));
        if (read >= 0 && read < self->tensors && args[read] != Py_None) {
            inputs[i] = args[read];
            replay.values[i] = addresses[read];
            continue;
        }
        read -= self->tensors;
        if (read < 0 || read >= PyTuple_GET_SIZE(fixed)) goto done;
        inputs[i] = PyTuple_GET_ITEM(fixed, read);
        PyObject *address = PyObject_CallMethodNoArgs(inputs[i], s_data_ptr);
        int status = address ? read_u64(address, NULL, &replay.values[i]) : -1;
        Py_XDECREF(address);
        if (status < 0) goto done;
    }
    PyObject *program = PyTuple_GET_ITEM(entry, E_PROGRAM);
    if (replay_program(program, inputs, count, stream, &replay) < 0) goto done;
    if (self->apply == Py_None) {
        result = all_returned(program, &replay);
        goto done;
    }
    PyObject *outputs = computed(program, &replay);
    if (outputs == NULL) goto done;
    result = attached(self, args, entry, outputs);
    Py_DECREF(outputs);

done:
    replay_release(&replay);
    Py_DECREF(entry);
    return result;
}

static PyObject *eager_call_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    EagerCall *self = (EagerCall *)callable;
    if (PyVectorcall_NARGS(nargsf) == self->arguments && kwnames == NULL) {
        PyObject *result = replayed(self, args);
        if (result != NULL) return result;
        PyErr_Clear();  /* the Python path computes the call again, and says what failed */
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static int eager_call_init(EagerCall *self, PyObject *args, PyObject *kwargs) {
    PyObject *fallback, *calls, *tensor_types, *strided, *transforms_active, *autocast_active, *precision_of,
        *grad_enabled, *apply;
    Py_ssize_t tensors, arguments, keyed;
    unsigned long long alignment;
    static char *names[] = {"fallback", "calls", "tensors", "arguments", "keyed", "tensor_types", "strided",
                            "alignment", "transforms_active", "autocast_active", "precision_of", "grad_enabled",
                            "apply", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!nnnO!OKOOOOO", names, &fallback, &PyDict_Type, &calls,
                                     &tensors, &arguments, &keyed, &PyTuple_Type, &tensor_types, &strided, &alignment,
                                     &transforms_active, &autocast_active, &precision_of, &grad_enabled, &apply))
        return -1;
    if (tensors < 1 || tensors > MAX_TENSORS || keyed < tensors || arguments < keyed || alignment == 0) {
        PyErr_SetString(PyExc_ValueError, "EagerCall: 1 to 8 tensors, keyed, no more keyed than arguments, a nonzero "
                                          "alignment");
        return -1;
    }
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->calls, Py_NewRef(calls));
    self->tensors = tensors;
    self->arguments = arguments;
    self->keyed = keyed;
    Py_XSETREF(self->tensor_types, Py_NewRef(tensor_types));
    Py_XSETREF(self->strided, Py_NewRef(strided));
    self->alignment = alignment;
    Py_XSETREF(self->transforms_active, Py_NewRef(transforms_active));
    Py_XSETREF(self->autocast_active, Py_NewRef(autocast_active));
    Py_XSETREF(self->precision_of, Py_NewRef(precision_of));
    Py_XSETREF(self->grad_enabled, Py_NewRef(grad_enabled));
    Py_XSETREF(self->apply, Py_NewRef(apply));
    self->vectorcall = eager_call_call;
    return 0;
}

static int eager_call_traverse(EagerCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->fallback);
    Py_VISIT(self->calls);
    Py_VISIT(self->tensor_types);
    Py_VISIT(self->strided);
    Py_VISIT(self->transforms_active);
    Py_VISIT(self->autocast_active);
    Py_VISIT(self->precision_of);
    Py_VISIT(self->grad_enabled);
    Py_VISIT(self->apply);
    return 0;
}

static int eager_call_clear(EagerCall *self) {
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->calls);
    Py_CLEAR(self->tensor_types);
    Py_CLEAR(self->strided);
    Py_CLEAR(self->transforms_active);
    Py_CLEAR(self->autocast_active);
    Py_CLEAR(self->precision_of);
    Py_CLEAR(self->grad_enabled);
    Py_CLEAR(self->apply);
    return 0;
}

static void eager_call_dealloc(EagerCall *self) {
    PyObject_GC_UnTrack(self);
    eager_call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject EagerCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "convgen._host_path.EagerCall",
    .tp_doc = "A convgen.torch op in eager mode: a call whose arguments convgen.torch.host_path remembered, replayed "
              "here; any other, the Python path's.",
    .tp_basicsize = sizeof(EagerCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)eager_call_init,
    .tp_dealloc = (destructor)eager_call_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)eager_call_traverse,
    .tp_clear = (inquiry)eager_call_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(EagerCall, vectorcall),
};

int eager_entry_fields(void) { return E_FIELDS; }

#define INTERN(variable, text) if ((variable = PyUnicode_InternFromString(text)) == NULL) return -1

int eager_call_names(void) {
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_layout, "layout");
    INTERN(s_is_nested, "is_nested");
    INTERN(s_get_device, "get_device");
    INTERN(s_is_contiguous, "is_contiguous");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_requires_grad, "requires_grad");
    return 0;
}
