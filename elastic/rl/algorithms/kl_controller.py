"""The KL-in-reward coefficient of PPO: fixed, or adapted towards a target KL (Ziegler et al. 2019,
https://arxiv.org/abs/1909.08593), selected by name through :data:`KL_CONTROLLERS`.

Same classes and update rule as verl (``verl/trainer/ppo/core_algos.py``: ``FixedKLController``,
``AdaptiveKLController``, ``get_kl_controller``) and OpenRLHF
(``openrlhf/trainer/ppo_utils/kl_controller.py``)::

    proportional_error = clip(current_kl / target_kl - 1, -0.2, 0.2)
    mult               = 1 + proportional_error * n_steps / horizon
    value             *= mult

``value`` is the coefficient to use for the next batch's rewards (``kl_coef`` of
:func:`~elastic.rl.algorithms.gae.token_level_rewards`); the caller calls ``update(current_kl, n_steps)`` once
per rollout batch with the batch's mean KL and its size (verl: ``n_steps = batch_size``). The
arithmetic is plain Python floats (IEEE double, the same operations in the same order as the
references' numpy float64), so the sequence of coefficients is bit-identical to theirs.

What neither reference does: refuse a step that would not keep the coefficient a coefficient.
At a KL far below target the factor is ``1 - 0.2 * n_steps / horizon``, which is 0 at
``n_steps = 5 * horizon`` and negative beyond (verl and TRL would go on with a 0 coefficient that
can never grow again, or a negative one that rewards divergence from the reference).
``update`` raises ValueError, before changing anything, when ``n_steps >= 5 * horizon`` (computed
as the factor's own float arithmetic, whatever the KL: the step size is the configuration's, not
the batch's), and when the product would overflow to inf. So every value ``update`` reaches is
finite and >= 0 (0 itself only by underflow, after hundreds of maximal decreases), and
``from_state_dict`` accepts all of them. The config refuses ``rl.kl_horizon`` <= samples per step
/ 5 up front (elastic/config/load.py); no clamp, no floor: within that range the sequence is
verl's bit for bit.

Also not in the references: the adaptive coefficient is state that a restart would lose (a
resumed run would start again from ``init_kl_coef``). ``state_dict()`` gives plain JSON-able
numbers for the checkpoint, and ``from_state_dict`` / :func:`kl_controller_from_state_dict` rebuild
a controller whose next ``update`` gives exactly what the uninterrupted one would have (Python's
``json`` writes floats with ``repr``, which round-trips exactly).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Union

import torch

PROPORTIONAL_ERROR_CLIP = 0.2
"""The relative KL error is clipped to +-this before it scales the coefficient (verl, OpenRLHF)."""


def _finite(name: str, x: float) -> float:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"kl controller: {name} must be finite, got {x}")
    return x


def _as_float(x: Union[float, torch.Tensor]) -> float:
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


class FixedKLController:
    """A constant coefficient; ``update`` does nothing."""

    kind = "fixed"

    def __init__(self, kl_coef: float):
        self.value = _finite("kl_coef", kl_coef)
        if self.value < 0:
            raise ValueError(f"kl controller: kl_coef must be >= 0, got {self.value}")

    def update(self, current_kl: Union[float, torch.Tensor], n_steps: int) -> None:
        """No-op (the arguments are accepted for one interface with the adaptive controller)."""

    def state_dict(self) -> Dict[str, Any]:
        """``{"kind": "fixed", "value": float}``: JSON-able."""
        return {"kind": self.kind, "value": self.value}

    @classmethod
    def from_state_dict(cls, state: Dict[str, Any]) -> "FixedKLController":
        _check_kind(state, cls.kind)
        return cls(kl_coef=state["value"])


class AdaptiveKLController:
    """Coefficient moved towards ``target_kl`` by at most ``0.2 * n_steps / horizon`` per update (relative)."""

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        self.value = _finite("init_kl_coef", init_kl_coef)
        self.target = _finite("target_kl", target_kl)
        self.horizon = _finite("horizon", horizon)
        if self.value < 0:
            raise ValueError(f"kl controller: init_kl_coef must be >= 0, got {self.value}")
        if self.target <= 0:
            raise ValueError(f"kl controller: target_kl must be > 0, got {self.target}")
        if self.horizon <= 0:  # verl asserts the same
            raise ValueError(f"kl controller: horizon must be > 0, got {self.horizon}")

    def update(self, current_kl: Union[float, torch.Tensor], n_steps: int) -> None:
        """``value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon``.

        ``current_kl``: the batch's mean KL (a float or a 0-d tensor, read on the host).
        ``n_steps``: how many samples the batch had. A non-finite KL raises ValueError rather
        than turning the coefficient into NaN for the rest of the run; so do ``n_steps >= 5 *
        horizon`` (the factor could be <= 0) and a product that overflows. A refused update
        leaves the controller as it was, so the value is always finite, >= 0 and restorable.
        """
        kl = _finite("current_kl", _as_float(current_kl))
        if n_steps < 0:
            raise ValueError(f"kl controller: n_steps must be >= 0, got {n_steps}")
        # The smallest factor any KL can give, in the same float operations as ``mult`` below
        # (each is monotone, so mult >= smallest for every clipped error): > 0 <=> n_steps < 5 * horizon.
        smallest = 1 + -PROPORTIONAL_ERROR_CLIP * n_steps / self.horizon
        if not smallest > 0:
            raise ValueError(f"kl controller: n_steps={n_steps} per update is >= 5 x horizon={self.horizon:g}: "
                             f"at a KL far below target the factor 1 - 0.2 * n_steps / horizon = {smallest:g} "
                             f"would make the coefficient <= 0; use horizon > n_steps / 5")
        proportional_error = min(max(kl / self.target - 1, -PROPORTIONAL_ERROR_CLIP), PROPORTIONAL_ERROR_CLIP)
        mult = 1 + proportional_error * n_steps / self.horizon
        value = self.value * mult
        if not math.isfinite(value):
            raise ValueError(f"kl controller: the coefficient {self.value!r} x {mult!r} would overflow "
                             f"(the KL has stayed above target_kl={self.target:g} for too long)")
        self.value = value

    def state_dict(self) -> Dict[str, Any]:
        """``{"kind": "adaptive", "value", "target_kl", "horizon"}`` (floats): JSON-able; ``value`` is
        the current coefficient, not the initial one."""
        return {"kind": self.kind, "value": self.value, "target_kl": self.target, "horizon": self.horizon}

    @classmethod
    def from_state_dict(cls, state: Dict[str, Any]) -> "AdaptiveKLController":
        _check_kind(state, cls.kind)
        return cls(init_kl_coef=state["value"], target_kl=state["target_kl"], horizon=state["horizon"])


KLController = Union[FixedKLController, AdaptiveKLController]

KL_CONTROLLERS: Dict[str, type] = {"fixed": FixedKLController, "adaptive": AdaptiveKLController}
"""Controller kind -> class."""


def _check_kind(state: Dict[str, Any], kind: str) -> None:
    if state.get("kind") != kind:
        raise ValueError(f"kl controller state: expected kind {kind!r}, got {state.get('kind')!r}")


def build_kl_controller(kind: str, *, kl_coef: float, target_kl: Optional[float] = None,
                        horizon: Optional[float] = None) -> KLController:
    """``"fixed"``: :class:`FixedKLController(kl_coef)`; ``"adaptive"``:
    :class:`AdaptiveKLController(kl_coef, target_kl, horizon)` (both required). verl's
    ``get_kl_controller`` with the config fields as arguments."""
    if kind not in KL_CONTROLLERS:
        raise ValueError(f"kl controller: unknown kind {kind!r} (known: {', '.join(KL_CONTROLLERS)})")
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if target_kl is None or horizon is None:
        raise ValueError("kl controller: 'adaptive' needs target_kl and horizon")
    return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)


def kl_controller_from_state_dict(state: Dict[str, Any]) -> KLController:
    """Rebuild whichever controller wrote ``state`` (its ``"kind"`` picks the class)."""
    kind = state.get("kind")
    if kind not in KL_CONTROLLERS:
        raise ValueError(f"kl controller state: unknown kind {kind!r} (known: {', '.join(KL_CONTROLLERS)})")
    from_state: Callable[[Dict[str, Any]], KLController] = KL_CONTROLLERS[kind].from_state_dict
    return from_state(state)
