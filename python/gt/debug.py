"""Debug utilities (the Python GT's `gt.debug`): the autograd tape and worker statistics."""

from . import _gt


def get_tape():
    """The ops recorded for autograd on this thread that a future `backward()` may still use:
    dicts of output_id, output_shape, dtype, input_ids, grad_fn (the op) and requires_grad."""
    return _gt._get_tape()


def print_tape():
    """Prints the tape, one op per line."""
    print(_gt._format_tape(), end="")


def get_worker_stats():
    """Every worker's statistics: {name: {backend, instructions, ..., operations: {total},
    ops: {op: {count, total_ms}}}}."""
    return _gt._worker_stats()


def print_worker_stats():
    """Prints every worker's statistics as a table."""
    print(_gt._format_worker_stats(), end="")
