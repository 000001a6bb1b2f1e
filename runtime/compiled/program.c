/* The replay of a launch program (convgen.launch_program, as host_path.py's `program_fields` lays it out): its
   scratch base, then its steps in order (outputs and scratch made by the callables the entry holds, launches through
   CuPy's binding of cuLaunchKernel with their argument slots on the C stack). */

#include "host_path.h"

#include <string.h>

/* Whether `a` (an entry's argument) and `b` are the same value of the same exact type: 1 == True == 1.0 and
   -0.0 == 0.0 to Python's equality, which keyed the lookup, but not here. Tuples (torch.Size too) item by item. */
int exact_same(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    PyTypeObject *type = Py_TYPE(a);
    if (Py_TYPE(b) != type) return 0;
    if (PyTuple_Check(a)) {
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
int read_u64(PyObject *object, PyObject *name, uint64_t *out) {
    PyObject *value = name ? PyObject_GetAttr(object, name) : Py_NewRef(object);
    if (value == NULL) return -1;
    unsigned long long bits = PyLong_AsUnsignedLongLongMask(value);
    Py_DECREF(value);
    if (bits == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)bits;
    return 0;
}

/* A CuPy array's device address: array.data.ptr. */
int array_address(PyObject *array, uint64_t *out) {
    PyObject *data = PyObject_GetAttr(array, s_data);
    if (data == NULL) return -1;
    int status = read_u64(data, s_ptr, out);
    Py_DECREF(data);
    return status;
}

/* A tuple of `type` (a NamedTuple's class, or tuple) holding `n` new references, which it takes. */
PyObject *named_tuple(PyTypeObject *type, Py_ssize_t n, PyObject **items) {
    PyObject *tuple = type->tp_alloc(type, n);
    if (tuple == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(tuple, i, items[i]);
    return tuple;
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
    return Py_NewRef(made[i]);
}

/* One launch step: (STEP_LAUNCH, function, grid, block, shared bytes, constants as 8-byte slots, holes as a flat
   tuple of (slot, address index) pairs); each hole adds its address to its slot. */
static int launch(PyObject *step, PyObject *launch_kernel, PyObject *stream, const uint64_t *values,
                  Py_ssize_t value_count) {
    uint64_t slots[MAX_SLOTS];
    void *pointers[MAX_SLOTS];
    PyObject *constants = PyTuple_GET_ITEM(step, 5), *holes = PyTuple_GET_ITEM(step, 6);
    Py_ssize_t bytes = PyBytes_GET_SIZE(constants), count = bytes / 8;
    if (count > MAX_SLOTS || bytes % 8) {
        PyErr_SetString(PyExc_ValueError, "a launch past the host path's parameter slots, or not in 8-byte slots");
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
    PyObject *parameters = PyLong_FromVoidPtr((void *)pointers);
    PyObject *result = NULL;
    if (one && zero && parameters) {
        PyObject *args[] = {PyTuple_GET_ITEM(step, 1), PyTuple_GET_ITEM(step, 2), one, one,
                            PyTuple_GET_ITEM(step, 3), one, one, PyTuple_GET_ITEM(step, 4), stream,
                            parameters, zero};
        result = PyObject_Vectorcall(launch_kernel, args, 11, NULL);
    }
    Py_XDECREF(one); Py_XDECREF(zero); Py_XDECREF(parameters);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

/* The address of what a step made: the program's address reader's (convgen.torch: Tensor.data_ptr), or without one
   a CuPy output's data.ptr and a bare allocation's ptr. */
static int made_address(PyObject *program, long kind, PyObject *object, uint64_t *out) {
    PyObject *address = PyTuple_GET_ITEM(program, P_ADDRESS);
    if (address == Py_None)
        return kind == STEP_SCRATCH ? read_u64(object, s_ptr, out) : array_address(object, out);
    PyObject *value = PyObject_CallOneArg(address, object);
    if (value == NULL) return -1;
    int status = read_u64(value, NULL, out);
    Py_DECREF(value);
    return status;
}

/* The program's scratch base (P_BASE_SIZE bytes; none for 0), held in `*held`: with no P_BASE_FREE, what
   P_BASE_ALLOC(size) returns, its address at .ptr, given back when dropped; else the address P_BASE_ALLOC(size,
   stream) returns, given back by P_BASE_FREE(address). */
static int make_base(PyObject *program, PyObject *stream, PyObject **held, uint64_t *address) {
    PyObject *size = PyTuple_GET_ITEM(program, P_BASE_SIZE), *alloc = PyTuple_GET_ITEM(program, P_BASE_ALLOC);
    *address = 0;
    int wanted = PyObject_IsTrue(size);
    if (wanted <= 0) return wanted;
    if (PyTuple_GET_ITEM(program, P_BASE_FREE) == Py_None) {
        *held = PyObject_CallOneArg(alloc, size);
        return *held == NULL ? -1 : read_u64(*held, s_ptr, address);
    }
    PyObject *args[] = {size, stream};
    *held = PyObject_Vectorcall(alloc, args, 2, NULL);
    return *held == NULL ? -1 : read_u64(*held, NULL, address);
}

/* The scratch base given back, after the program's launches are queued (the stream orders any reuse after them). */
static int drop_base(PyObject *program, PyObject *held) {
    if (held == NULL) return 0;
    PyObject *free_base = PyTuple_GET_ITEM(program, P_BASE_FREE);
    int status = 0;
    if (free_base != Py_None) {
        PyObject *result = PyObject_CallOneArg(free_base, held);
        status = result == NULL ? -1 : 0;
        Py_XDECREF(result);
    }
    Py_DECREF(held);
    return status;
}

/* `program` replayed on the stream `stream`: `replay->values` holds the addresses of its `input_count` inputs
   (`inputs`, in the program's order, what an output made like an input is made like). 0, or -1 with an exception
   set; what was made is in `replay` either way, for replay_release. */
int replay_program(PyObject *program, PyObject *const *inputs, Py_ssize_t input_count, uint64_t stream,
                   Replay *replay) {
    replay->made_count = 0;
    if (input_count + 1 > MAX_VALUES) {
        PyErr_SetString(PyExc_ValueError, "a program with more inputs than the host path holds");
        return -1;
    }
    PyObject *stream_object = PyLong_FromUnsignedLongLong(stream), *held = NULL;
    if (stream_object == NULL) return -1;
    int status = make_base(program, stream_object, &held, &replay->values[input_count]);
    replay->value_count = input_count + 1;
    PyObject *steps = PyTuple_GET_ITEM(program, P_STEPS), *launch_kernel = PyTuple_GET_ITEM(program, P_LAUNCH);
    for (Py_ssize_t s = 0; status == 0 && s < PyTuple_GET_SIZE(steps); s++) {
        PyObject *step = PyTuple_GET_ITEM(steps, s);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(step, 0));
        if (kind == STEP_LAUNCH) {
            status = launch(step, launch_kernel, stream_object, replay->values, replay->value_count);
            continue;
        }
        if (replay->value_count >= MAX_VALUES) {
            PyErr_SetString(PyExc_ValueError, "a program that makes more than the host path holds");
            status = -1;
            break;
        }
        PyObject *made;
        if (kind == STEP_OUTPUT_LIKE) {
            Py_ssize_t like = PyLong_AsSsize_t(PyTuple_GET_ITEM(step, 2));
            if (like < 0 || like >= input_count) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "an output made like no input");
                status = -1;
                break;
            }
            made = PyObject_CallOneArg(PyTuple_GET_ITEM(step, 1), inputs[like]);
        } else {
            PyObject *kwargs = PyTuple_GET_ITEM(step, 3);
            PyObject *make = PyTuple_GET_ITEM(step, 1);
            made = PyObject_Call(make, PyTuple_GET_ITEM(step, 2), kwargs == Py_None ? NULL : kwargs);
        }
        if (made == NULL) { status = -1; break; }
        replay->made[replay->made_count++] = made;
        status = made_address(program, kind, made, &replay->values[replay->value_count++]);
    }
    if (status < 0) {  /* give the base back without losing the error that stopped the replay */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (drop_base(program, held) < 0) PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    } else {
        status = drop_base(program, held);
    }
    Py_DECREF(stream_object);
    return status;
}

/* The program's return `which` (new reference): what it made, picked by the program's return indices. */
PyObject *replay_returned(PyObject *program, Py_ssize_t which, Replay *replay) {
    PyObject *returns = PyTuple_GET_ITEM(program, P_RETURNS);
    if (which >= PyTuple_GET_SIZE(returns)) Py_RETURN_NONE;
    return picked(PyTuple_GET_ITEM(returns, which), replay->made, replay->made_count);
}

void replay_release(Replay *replay) {
    for (Py_ssize_t i = 0; i < replay->made_count; i++) Py_DECREF(replay->made[i]);
    replay->made_count = 0;
}
