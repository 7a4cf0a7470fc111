"""Expected errors of rank functions, returned by the ranks instead of raised.

A function that raises in the warm rank pool (``dist_pool``, ``run_distributed``) makes the
pool kill its ranks and start new ones for the next test: about 1.5-3 CPU s a rank (fork,
imports, rendezvous; docs/dev/test-suite-speed.md, fourth pass). A test that expects the error
runs ``error_of(fn, *args)`` in the ranks and matches the messages they return, and the pool
stays warm. Only for errors every rank raises at the same point: one that leaves a peer waiting
in a collective still needs the pool's failure path.

    messages = dist_pool.run(error_of, args=(_refused_setup, 3))
    assert all(m and "must divide" in m for m in messages)
"""


def error_of(fn, *args, **kwargs):
    """``"TypeName: message"`` of what ``fn(*args, **kwargs)`` raises, None if it returns."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the caller asserts on the message: nothing is swallowed unseen
        return f"{type(exc).__name__}: {exc}"
    return None
