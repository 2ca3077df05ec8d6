"""Plain JSON data for the grading channel: ``to_plain(value)`` and ``from_plain(data)``.

Only data crosses between the grader and the student's kernel, never objects, so neither side
can hand the other a callable or a class. JSON scalars (numbers, strings, booleans, None) and
lists pass as they are; everything else is a dict tagged with ``"__memwall__"``:

- ``{"__memwall__": "tuple", "items": [...]}`` and ``{"__memwall__": "dict", "items": [[k, v], ...]}``
  (so keys may be ints and a student's dict can never pose as a tag);
- ``{"__memwall__": "array", "kind": "numpy" | "torch", "dtype": "float32", "shape": [...],
  "data": [...flat...]}``;
- ``{"__memwall__": "build", "builder": "fake_clock_workload", "spec": {...}}``: an input that
  ``memwall.exercise_driver.builders`` turns into an object where the function is called. Build
  specs are accepted only as inputs (``allow_build=True``), never in a student's result.
- ``{"__memwall__": "remote", "id": 0, "kind": "ABBench", "methods": [...], "attributes": [...]}``:
  an object that stays in the grader (a fake bench: its true timings must not reach the
  student's process). ``to_plain(..., remote=register)`` writes it for objects whose class sets
  ``served_remotely``; ``from_plain(..., remote=make_proxy)`` turns it into a stand-in whose
  method calls go back over the channel (``exercise_driver.driver``).
"""

import math
import numbers

TAG = "__memwall__"
MAX_DEPTH = 40
MAX_ITEMS = 4_000_000  # numbers in one value: enough for any exercise, not for a memory bomb


class NotPlain(ValueError):
    """A value the channel cannot carry (an object, a function, a complex number...)."""


def to_plain(value, _depth=0, _budget=None, remote=None):
    """``value`` as JSON-ready data (see the module docstring); raises NotPlain. ``remote(obj)``
    returns a remote handle for an object that stays on this side, or None."""
    budget = _budget if _budget is not None else [MAX_ITEMS]
    if _depth > MAX_DEPTH:
        raise NotPlain("nested too deeply")
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlain("too large")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, list):
        return [to_plain(item, _depth + 1, budget, remote) for item in value]
    if isinstance(value, tuple):
        items = [to_plain(item, _depth + 1, budget, remote) for item in value]
        return {TAG: "tuple", "items": items}
    if is_build_spec(value):
        return value
    if isinstance(value, dict):
        items = [
            [to_plain(key, _depth + 1, budget, remote), to_plain(item, _depth + 1, budget, remote)]
            for key, item in value.items()
        ]
        return {TAG: "dict", "items": items}
    array = _array_to_plain(value, budget)
    if array is not None:
        return array
    handle = remote(value) if remote is not None else None
    if handle is not None:
        return handle
    raise NotPlain(f"a {type(value).__name__} cannot be sent to the grader")


def from_plain(data, allow_build=False, _depth=0, remote=None):
    """The value ``to_plain`` encoded; build specs are built only when ``allow_build``, remote
    handles become ``remote(handle)`` only when it is given."""
    if _depth > MAX_DEPTH:
        raise NotPlain("nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [from_plain(item, allow_build, _depth + 1, remote) for item in data]
    if not isinstance(data, dict):
        raise NotPlain(f"unexpected {type(data).__name__}")
    tag = data.get(TAG)
    if tag == "tuple":
        return tuple(from_plain(item, allow_build, _depth + 1, remote) for item in _items(data))
    if tag == "dict":
        pairs = [_pair(pair) for pair in _items(data)]
        return {
            _hashable(from_plain(key, allow_build, _depth + 1, remote)): from_plain(
                item, allow_build, _depth + 1, remote
            )
            for key, item in pairs
        }
    if tag == "array":
        return _array_from_plain(data)
    if tag == "remote" and remote is not None:
        return remote(remote_handle_fields(data))
    if tag == "build" and allow_build == "keep":  # a recorded case, built when it is called
        return data
    if tag == "build" and allow_build:
        from memwall.exercise_driver.builders import build

        return build(str(data.get("builder")), from_plain(data.get("spec"), False, _depth + 1))
    raise NotPlain(f"unknown value tag {str(tag)[:40]!r}")


def remote_handle(number: int, value) -> dict:
    """The handle by which the other side calls ``value``'s public methods and reads its public
    properties (nothing else of it crosses)."""
    cls = type(value)
    names = [name for name in dir(cls) if not name.startswith("_")]
    return {
        TAG: "remote",
        "id": number,
        "kind": cls.__name__,
        "methods": [name for name in names if callable(getattr(cls, name))],
        "attributes": [name for name in names if isinstance(getattr(cls, name), property)],
    }


def remote_handle_fields(data) -> dict:
    """A received handle, checked: an int id, a kind, lists of names."""
    fields = {key: data.get(key) for key in ("id", "kind", "methods", "attributes")}
    names = (fields["methods"], fields["attributes"])
    if not (
        isinstance(fields["id"], int)
        and isinstance(fields["kind"], str)
        and all(
            isinstance(group, list) and all(isinstance(n, str) for n in group) for group in names
        )
    ):
        raise NotPlain("malformed remote handle")
    return fields


def build_spec(builder: str, **spec) -> dict:
    """An input that becomes ``builders.build(builder, spec)`` where the function is called."""
    return {TAG: "build", "builder": builder, "spec": to_plain(spec)}


def is_build_spec(value) -> bool:
    return (
        isinstance(value, dict)
        and value.get(TAG) == "build"
        and set(value)
        == {
            TAG,
            "builder",
            "spec",
        }
    )


def build_arguments(value):
    """A case with its build specs turned into objects (what the called function receives)."""
    if is_build_spec(value):
        return from_plain(value, allow_build=True)
    if isinstance(value, list):
        return [build_arguments(item) for item in value]
    if isinstance(value, tuple):
        return tuple(build_arguments(item) for item in value)
    if isinstance(value, dict):
        return {key: build_arguments(item) for key, item in value.items()}
    return value


def _items(data):
    items = data.get("items")
    if not isinstance(items, list):
        raise NotPlain("malformed value")
    return items


def _pair(pair):
    if not isinstance(pair, list) or len(pair) != 2:
        raise NotPlain("malformed dict item")
    return pair


def _hashable(key):
    if isinstance(key, list):
        raise NotPlain("a list cannot be a dict key")
    return key


def _array_to_plain(value, budget):
    kind = "torch" if hasattr(value, "detach") else "numpy" if hasattr(value, "__array__") else None
    if kind is None:
        return None
    if kind == "torch":
        tensor = value.detach().cpu()
        dtype = str(tensor.dtype).removeprefix("torch.")
        array = (tensor.float() if dtype == "bfloat16" else tensor).numpy()
    else:
        import numpy as np

        array = np.asarray(value)
        dtype = str(array.dtype)
        if array.dtype.kind not in "biuf":
            raise NotPlain(f"a numpy array of {dtype} cannot be sent to the grader")
    budget[0] -= int(array.size)
    if budget[0] < 0:
        raise NotPlain("too large")
    flat = [_plain_number(item) for item in array.reshape(-1).tolist()]
    return {TAG: "array", "kind": kind, "dtype": dtype, "shape": list(array.shape), "data": flat}


def _plain_number(item):
    if isinstance(item, complex):
        raise NotPlain("complex numbers cannot be sent to the grader")
    return item


def _array_from_plain(data):
    import numpy as np

    shape, flat, dtype = data.get("shape"), data.get("data"), str(data.get("dtype"))
    if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise NotPlain("malformed array shape")
    if not isinstance(flat, list) or len(flat) != math.prod(shape):
        raise NotPlain("array data does not match its shape")
    if not all(isinstance(item, (int, float, bool)) for item in flat):
        raise NotPlain("array data must be numbers")
    if data.get("kind") == "torch":
        import torch

        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise NotPlain(f"unknown torch dtype {dtype[:20]!r}")
        return torch.tensor(flat, dtype=torch_dtype).reshape(shape)
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError:
        raise NotPlain(f"unknown numpy dtype {dtype[:20]!r}") from None
    if numpy_dtype.kind not in "biuf":
        raise NotPlain(f"unsupported numpy dtype {dtype[:20]!r}")
    return np.array(flat, dtype=numpy_dtype).reshape(shape)
