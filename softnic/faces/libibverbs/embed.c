/* How softnic's libibverbs.so.1 lives inside whatever process loaded it.
 *
 * Three kinds of host:
 *  - a C program that links libibverbs, or loads it from a plugin with dlopen
 *    (UCX's libuct_ib, opened RTLD_LOCAL): the library starts its own interpreter
 *    (the Python that built it, found through DT_NEEDED libpython) at the first
 *    verbs call, with the module path of the environment that built it
 *    (SN_PYTHON_PATH: its standard library and site-packages).  Extension modules (cffi's backend, ...) are not linked to
 *    libpython on Debian or pyenv, so libpython's symbols must be global: the
 *    constructor reopens it RTLD_GLOBAL|RTLD_NOLOAD, whatever the loader did.
 *  - a process that is already a Python interpreter (Debian's python3 running
 *    its pyverbs or mpi4py): there is one interpreter, the host's.  The library's
 *    references to the C API bind to the host's (the executable exports them
 *    and comes first in symbol lookup), so the backend runs in the host's
 *    interpreter, whose path stays the program's (softnic's modules come through
 *    finders only softnic's imports reach: softnic/faces/privateimport.py).  A host of another minor version than the build's would not share its
 *    ABI: every call then fails (no devices) with a message saying what to do.
 *    Calls after the host interpreter has finished fail (EIO) with a message.
 *  - a child forked after the parent's first verbs call: its devices, threads and
 *    sockets stayed in the parent, and the interpreter may have been forked while
 *    another thread held its lock; every call fails (EIO, no devices) with a
 *    message, never touching the interpreter, so nothing waits for ever.  Except a
 *    Python host's own fork (os.fork, multiprocessing) while no device was open:
 *    Python re-initialises its interpreter and the child starts afresh
 *    (sn_fork_resumed).
 *
 * Included by build.py after <Python.h>, before the generated sn_* wrappers. */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int sn_started;      /* this process has called into the backend */
static volatile int sn_forked;       /* ... and this is a child forked after that */
static int sn_bad_host;              /* the host interpreter's ABI is not the build's */
static int sn_host_python;           /* the host process is a Python interpreter */

static void sn_after_fork_child(void)
{
    if (sn_started)
        sn_forked = 1;
}

/* Called by backend.py from Python's after-fork hook in the child (os.fork or
 * multiprocessing in a Python host, so Python has re-initialised its interpreter) when
 * the parent had no device open: nothing of the parent's is left to lose, and the child
 * opens devices of its own as a fresh process would. */
void sn_fork_resumed(void)
{
    sn_forked = 0;
}

/* Is the host process a Python interpreter (embedding.EMBED_API)? */
int sn_python_host(void)
{
    return sn_host_python;
}

__attribute__((constructor)) static void sn_embed_init(void)
{
    Dl_info info;
    pthread_atfork(NULL, NULL, sn_after_fork_child);
    if (Py_IsInitialized()) {
        /* the host is a Python interpreter: use it, if its ABI is the build's */
        sn_host_python = 1;
        const char *v = Py_GetVersion();
        size_t n = strlen(SN_PYTHON_VERSION);
        if (strncmp(v, SN_PYTHON_VERSION, n) != 0 || (v[n] != '.' && v[n] != ' '))
            sn_bad_host = 1;
        return;
    }
    /* the interpreter will be ours: make its symbols global for extension modules */
    if (dladdr((void *)&Py_IsInitialized, &info) && info.dli_fname &&
        strstr(info.dli_fname, "libpython"))
        dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    /* and must find its standard library and softnic's environment, whatever program
     * it finds itself in, and only those: the program's PYTHON* variables (PYTHONPATH,
     * PYTHONHOME, ...) are for its own Python programs, not for softnic's interpreter */
    Py_IgnoreEnvironmentFlag = 1;
    Py_NoUserSiteDirectory = 1;
    Py_SetPythonHome(SN_PYTHON_HOME);
    Py_SetPath(SN_PYTHON_PATH);
}

static int sn_entry_forbidden(void)
{
    static int told;
    /* a Python host whose interpreter has finished (a C atexit handler, after
     * Py_Finalize) has no softnic any more */
    int gone = sn_host_python && !Py_IsInitialized();
    if (sn_forked || sn_bad_host || gone) {
        if (!told) {
            told = 1;
            if (gone)
                fprintf(stderr, "softnic libibverbs: a verbs call after this Python "
                        "process's interpreter finished (from an exit handler); softnic's "
                        "devices are gone, so it fails (EIO).\n");
            else if (sn_forked)
                fprintf(stderr, "softnic libibverbs: this process was forked after its "
                        "parent's first verbs call; softnic's devices stay in the parent, "
                        "so verbs fail here (EIO).  Open devices after fork(), or exec.\n");
            else
                fprintf(stderr, "softnic libibverbs: built for Python %s but loaded into "
                        "a Python %.10s process; rebuild it with this Python "
                        "(that python -m softnic.cli build-libibverbs).\n",
                        SN_PYTHON_VERSION, Py_GetVersion());
        }
        return 1;
    }
    sn_started = 1;
    return 0;
}

/* Release the interpreter lock if this thread holds it (a Python host calling verbs),
 * so that waiting here never stops the progress threads; NULL if not held. */
static void *sn_gil_release(void)
{
    if (Py_IsInitialized() && PyGILState_Check())
        return PyEval_SaveThread();
    return NULL;
}

static void sn_gil_restore(void *state)
{
    if (state)
        PyEval_RestoreThread((PyThreadState *)state);
}
