"""The student's side of grading: what runs inside the student's (sandboxed) kernel.

During `memwall grade` the student's notebook runs in a sandbox where ``memwall.grading``, the
reference answers and ``solutions/`` do not exist. This package is all that notebook gets from
the grader, so it holds no answers and decides no points:

- ``driver.serve(name, answer)`` replaces each check cell. It connects to the grader's socket,
  then answers calls: the grader sends plain inputs, ``serve`` calls the student's function and
  sends back a plain value. The grader compares that value with its reference, in its own
  process (``memwall.grading.channel``).
- ``values`` turns arguments and results into plain JSON data and back: numbers, strings,
  lists, tuples, dicts, numpy arrays and torch tensors, plus *build specs* that a builder turns
  into an object (``builders``), e.g. a fake clock and workload for an exercise that measures.
- ``recorder`` is a small pytest plugin that notes how each cell ended (timeouts, a dead
  kernel), for the status column only.
- ``harden`` makes the process non-dumpable and without core files.
"""
