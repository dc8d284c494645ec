"""Launching ranks: the machinery behind `dl.launch` and `%%distributed`, which no learner reads.

    launch       the request checked, the function pickled (serialize), the result returned
    supervisor   one process per rank (started by starting), five pipes each, the event loop
    worker       inside a rank: the process group, the learner's function, the messages back
    protocol     those messages; receiving: what they become in the kernel
    lines        every output line labelled with its rank; progress: the status row
    failures     what died, raised, hung or could not be read, as one LaunchError with a hint
    stacks       the stacks of hung ranks; processes: the processes below a process
    audit        the device audit; collective_inputs: a collective's tensors checked first
"""
