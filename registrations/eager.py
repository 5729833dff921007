"""The public entry of the eager fast path: ``eager_call(op)`` returns ``op`` as a
plain callable that, in plain eager calls, skips the dispatcher's crossing
(``liger_nn`` calls every op through it)."""

from registrations._library import fast_call as eager_call

__all__ = ["eager_call"]
