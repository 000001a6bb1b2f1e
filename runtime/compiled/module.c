/* convgen._host_path: op calls compiled for arguments they have run before. TapeApply is the CUDA tape's
   (convgen.host_path), EagerCall convgen.torch's eager ops' (convgen.torch.host_path); both replay a launch program
   (program.c). */

#include "host_path.h"

PyObject *s_data, *s_ptr;

static struct PyModuleDef host_path_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "convgen._host_path",
    .m_doc = "Op calls compiled for arguments they have run before (convgen.host_path, convgen.torch.host_path).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__host_path(void) {
    if ((s_data = PyUnicode_InternFromString("data")) == NULL || (s_ptr = PyUnicode_InternFromString("ptr")) == NULL
        || tape_apply_names() < 0 || eager_call_names() < 0 || PyType_Ready(&TapeApplyType) < 0
        || PyType_Ready(&EagerCallType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&host_path_module);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "TapeApply", (PyObject *)&TapeApplyType) < 0
        || PyModule_AddObjectRef(module, "EagerCall", (PyObject *)&EagerCallType) < 0
        || PyModule_AddIntConstant(module, "MAX_SLOTS", MAX_SLOTS) < 0
        || PyModule_AddIntConstant(module, "MAX_VALUES", MAX_VALUES) < 0
        || PyModule_AddIntConstant(module, "PROGRAM_FIELDS", P_FIELDS) < 0
        || PyModule_AddIntConstant(module, "TAPE_ENTRY_FIELDS", tape_entry_fields()) < 0
        || PyModule_AddIntConstant(module, "EAGER_ENTRY_FIELDS", eager_entry_fields()) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
