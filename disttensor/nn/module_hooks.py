"""Module hooks with PyTorch 2.x semantics (mixed into :class:`~disttensor.nn.Module`).

* ``register_forward_pre_hook(hook, *, prepend=False, with_kwargs=False)``: ``hook(module,
  args)`` (``hook(module, args, kwargs)`` with ``with_kwargs``) runs before ``forward``; a
  value it returns replaces ``args`` (a non-tuple is wrapped in one), or with ``with_kwargs``
  must be a ``(args, kwargs)`` pair.
* ``register_forward_hook(hook, *, prepend=False, with_kwargs=False, always_call=False)``:
  ``hook(module, args, output)`` (``hook(module, args, kwargs, output)``) after ``forward``; a
  value it returns replaces the output.  ``always_call``: also when ``forward`` raised.
* ``register_full_backward_pre_hook(hook, prepend=False)``: ``hook(module, grad_output)``
  when the gradients of the module's outputs are complete; may return a replacement tuple.
* ``register_full_backward_hook(hook, prepend=False)``: ``hook(module, grad_input,
  grad_output)`` when the gradients of the module's positional tensor inputs are complete
  (``None`` for inputs that need none); may return a replacement ``grad_input`` tuple.

Each returns a :class:`~disttensor.autograd.hooks.RemovableHandle`.  Hooks run on every
rank; gradients are DistArrays (each rank its block) or replicated arrays.  A backward hook
returning a tuple of the wrong length or a gradient of the wrong shape raises
``RuntimeError`` (on every rank: the check reads global shapes only).  Backward hooks see the
gradients of a module called with tensors; the module's inputs and outputs are passed through
identity nodes (one for all inputs, one for all outputs), as PyTorch's ``BackwardHook``.
"""
from __future__ import annotations

from ..autograd.hooks import add_hook, bundle, grad_shape, hook_dict
from ..autograd.tensor import Tensor

__all__ = ["ModuleHooks"]

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_backward_pre_hooks", "_backward_hooks")


def _check_grads(kind: str, new, old) -> tuple:
    """``new`` (what a backward hook returned) checked against ``old`` (the gradients it
    replaces): a tuple of the same length with each gradient of the same shape."""
    if not isinstance(new, (tuple, list)):
        new = (new,)
    new = tuple(g.data if isinstance(g, Tensor) else g for g in new)
    if len(new) != len(old):
        raise RuntimeError(f"backward hook returned {len(new)} gradients for the {len(old)} "
                           f"{kind} of the module")
    for i, (a, b) in enumerate(zip(new, old)):
        if a is not None and b is not None and grad_shape(a) != grad_shape(b):
            raise RuntimeError(f"backward hook returned a gradient of shape {grad_shape(a)} "
                               f"for {kind} {i}, which has shape {grad_shape(b)}")
    return new


class ModuleHooks:
    """The hook registry and the hooked call of :class:`~disttensor.nn.Module`."""

    def _hooks(self, name: str):
        d = self.__dict__.get(name)
        if d is None:
            d = hook_dict()
            object.__setattr__(self, name, d)
        return d

    def register_forward_pre_hook(self, hook, *, prepend: bool = False,
                                  with_kwargs: bool = False):
        hooks = self._hooks("_forward_pre_hooks")
        handle = add_hook(hooks, hook, prepend, self._hooks("_forward_pre_hooks_with_kwargs"))
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        return handle

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False):
        hooks = self._hooks("_forward_hooks")
        handle = add_hook(hooks, hook, prepend, self._hooks("_forward_hooks_with_kwargs"),
                          self._hooks("_forward_hooks_always_called"))
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        return handle

    def register_full_backward_pre_hook(self, hook, prepend: bool = False):
        return add_hook(self._hooks("_backward_pre_hooks"), hook, prepend)

    def register_full_backward_hook(self, hook, prepend: bool = False):
        return add_hook(self._hooks("_backward_hooks"), hook, prepend)

    def register_backward_hook(self, hook):
        raise NotImplementedError("register_backward_hook (deprecated in PyTorch) is not "
                                  "provided: use register_full_backward_hook")

    # -- the call ------------------------------------------------------------------------------
    def _has_hooks(self) -> bool:
        return any(map(self.__dict__.get, _HOOK_DICTS))

    def _call_hooked(self, args: tuple, kwargs: dict):
        d = self.__dict__
        for hid, hook in list(d.get("_forward_pre_hooks", {}).items()):
            if d["_forward_pre_hooks_with_kwargs"].get(hid):
                res = hook(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of "
                                           f"(new_args, new_kwargs), but got {res!r}")
                    args, kwargs = res
            else:
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        bw_hooks, bw_pre = d.get("_backward_hooks"), d.get("_backward_pre_hooks")
        state = {"nargs": len(args)}
        if bw_hooks:
            hooked = tuple(bundle(args, lambda grads: self._run_backward_hooks(grads, state),
                                  f"{type(self).__name__}BackwardHook"))
            # no input needs a gradient: the hooks run with the outputs' gradients
            state["inputs_hooked"] = any(a is not b for a, b in zip(hooked, args))
            args = hooked
        try:
            result = self.forward(*args, **kwargs)
        except Exception:
            for hid, hook in list(d.get("_forward_hooks", {}).items()):
                if d["_forward_hooks_always_called"].get(hid):
                    try:
                        if d["_forward_hooks_with_kwargs"].get(hid):
                            hook(self, args, kwargs, None)
                        else:
                            hook(self, args, None)
                    except Exception:  # noqa: BLE001 - the forward's error is the one raised
                        pass
            raise
        for hid, hook in list(d.get("_forward_hooks", {}).items()):
            if d["_forward_hooks_with_kwargs"].get(hid):
                res = hook(self, args, kwargs, result)
            else:
                res = hook(self, args, result)
            if res is not None:
                result = res
        if bw_hooks or bw_pre:
            result = self._hook_outputs(result, state)
        return result

    def _hook_outputs(self, result, state: dict):
        single = isinstance(result, Tensor)
        outs = [result] if single else list(result) if isinstance(result, (tuple, list)) \
            else None
        if outs is None:
            return result

        def on_grads(grads):
            grads = tuple(grads)
            for hook in list(self.__dict__.get("_backward_pre_hooks", {}).values()):
                res = hook(self, grads)
                if res is not None:
                    grads = _check_grads("outputs", res, grads)
            state["grad_output"] = grads
            if self.__dict__.get("_backward_hooks") and not state.get("inputs_hooked"):
                self._run_backward_hooks([None] * state["nargs"], state)
            return list(grads)
        outs = bundle(outs, on_grads, f"{type(self).__name__}BackwardHook")
        if single:
            return outs[0]
        return type(result)(outs) if isinstance(result, list) else tuple(outs)

    def _run_backward_hooks(self, grads, state: dict):
        grads = tuple(grads)
        grad_output = state.get("grad_output", ())
        for hook in list(self.__dict__.get("_backward_hooks", {}).values()):
            res = hook(self, grads, grad_output)
            if res is not None:
                grads = _check_grads("inputs", res, grads)
        return list(grads)
