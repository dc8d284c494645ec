"""What a failed launch tells the learner to do, as data: one hint per kind of failure.

failures.py picks the hint from what the ranks did; the words live here, so that changing
what a learner reads touches no logic. Each is marked for the catalogue (`N_`) and read in the
learner's language where a failure is reported (`_`).
"""

from dpmp_lab.i18n.messages import N_

SIGNAL_HINTS = {
    "SIGABRT": N_("aborted; with gloo this is often a collective whose tensors differ in size "
                  "or dtype across ranks"),
    "SIGSEGV": N_("segmentation fault in native code"),
    "SIGKILL": N_("killed from outside, often by the out-of-memory killer"),
    "SIGBUS": N_("bus error in native code, often shared memory running out"),
    "SIGFPE": N_("arithmetic error in native code"),
}

HANG_HINT = N_(
    "a rank that never finishes is usually waiting in a collective that another rank did not "
    "call: a collective inside `if rank == ...`, a different number of loop iterations per rank, "
    "or collectives issued in a different order. The stack above shows where each rank waited."
)
P2P_HANG_HINT = N_(
    "a send or recv that never completes: its partner never posted the matching recv or send "
    "(or posted it with another peer or tag, or posted an isend and dropped its handle without "
    "waiting on it, which gloo need not deliver), or every rank sent first and waits for a receiver "
    "that is itself sending (gloo's blocking send returns only once the receiver took the data). "
    "Post both directions at once with isend/irecv (or dist.batch_isend_irecv) and wait on "
    "them, or order them (even ranks send first, odd ranks receive first). The stack above "
    "shows where each rank waited."
)
HANDLE_HANG_HINT = N_(
    "a rank waits on a request handle that never completes: the Work an isend, an irecv or an "
    "async collective returned. The request was posted, and the wait is where the rank noticed "
    "that nothing answered it: for a send or a receive, the partner never posted the matching "
    "receive or send (or posted it to another peer, with another tag, or only after waiting "
    "for something this rank does later); for an async collective, another rank never issued "
    "it. Look at what each rank posted before it waited. The stack above shows where each rank "
    "waited."
)

UNPICKLABLE_HINT = N_(
    "a result is pickled in the rank and unpickled in the notebook, so an object of a class "
    "the notebook cannot import (defined in a module only the ranks see), or one whose "
    "unpickling raises, cannot come back. Return plain values, numbers or tensors, or define "
    "the class in the notebook."
)

DESTROYED_GROUP_HINT = N_(
    "the launcher destroys every rank's process group once all of them returned. A rank that "
    "destroys its own earlier closes the connections its peers still wait on, so they fail "
    "(gloo: \"Connection closed by peer\") or time out instead of finishing: remove "
    "dist.destroy_process_group() from the function. If the peers then hang, that rank never "
    "called the collective they wait in."
)

SHAPES_HINT = N_("the ranks passed tensors of different shapes or dtypes to the same collective, "
                 "or a send and its recv disagree on them.")
MEMORY_HINT = N_("the machine may have run out of memory: try smaller tensors or fewer ranks.")
