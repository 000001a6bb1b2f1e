/* convgen._host_path's shared parts: the replay of a launch program (program.c), used by the CUDA tape's op call
   (tape_apply.c) and by convgen.torch's eager op call (eager_call.c). */

#ifndef CONVGEN_HOST_PATH_H
#define CONVGEN_HOST_PATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_SLOTS 64   /* a launch's parameters; no entry is made for more */
#define MAX_VALUES 64  /* a program's addresses: its inputs, its scratch base, what it makes */

/* A program's fields, in the order host_path.py's PROGRAM_FIELDS names them. */
enum { P_STEPS, P_RETURNS, P_BASE_SIZE, P_BASE_ALLOC, P_BASE_FREE, P_ADDRESS, P_LAUNCH, P_FIELDS };
/* A step's first item. */
enum { STEP_OUTPUT = 0, STEP_SCRATCH = 1, STEP_LAUNCH = 2, STEP_OUTPUT_LIKE = 3 };

/* One replay of a program: the addresses it launches with (its inputs' first, set by the caller) and what it made. */
typedef struct {
    uint64_t values[MAX_VALUES];
    Py_ssize_t value_count;
    PyObject *made[MAX_VALUES];
    Py_ssize_t made_count;
} Replay;

extern PyObject *s_data, *s_ptr;

int exact_same(PyObject *a, PyObject *b);
int read_u64(PyObject *object, PyObject *name, uint64_t *out);
int array_address(PyObject *array, uint64_t *out);
PyObject *named_tuple(PyTypeObject *type, Py_ssize_t n, PyObject **items);
int replay_program(PyObject *program, PyObject *const *inputs, Py_ssize_t input_count, uint64_t stream,
                   Replay *replay);
PyObject *replay_returned(PyObject *program, Py_ssize_t which, Replay *replay);
void replay_release(Replay *replay);

extern PyTypeObject TapeApplyType, EagerCallType;
int tape_apply_names(void);
int eager_call_names(void);
int tape_entry_fields(void);
int eager_entry_fields(void);

#endif
