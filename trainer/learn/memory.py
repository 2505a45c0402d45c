"""Out-of-memory: recognise it, and estimate memory before asking for it.

:func:`is_out_of_memory` classifies typed exceptions first, then messages of the
allocation failures that arrive as plain RuntimeErrors. Anything else is not OOM.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import psutil

from trainer.config.roster import agent_spec

FLOAT_BYTES = 4
GIB = 1024**3
# Messages of allocation failures raised as RuntimeError by torch's CUDA, cuBLAS, cuDNN and CPU allocators.
OOM_MESSAGES = ("cuda out of memory", "out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                "cudnn_status_not_enough_workspace", "can't allocate memory", "failed to allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    import torch  # lazy: torch takes seconds to import

    typed = tuple(
        t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
    )
    if isinstance(exc, typed) or isinstance(exc, MemoryError):  # NumPy's _ArrayMemoryError is a MemoryError
        return True
    if isinstance(exc, RuntimeError):
        message = str(exc).lower()
        return any(m in message for m in OOM_MESSAGES)
    return False


def free_memory(device: str) -> None:
    """Give back what a failed step held (called outside the except block, so its frames are gone)."""

    gc.collect()
    if device == "cuda":
        import torch  # lazy: torch takes seconds to import

        torch.cuda.empty_cache()


def available_bytes(device: str) -> int:
    """Free memory where the batch lives: the GPU's, or the host's available RAM."""
    if device == "cuda":
        import torch  # lazy: torch takes seconds to import

        return int(torch.cuda.mem_get_info()[0])

    return int(psutil.virtual_memory().available)


def host_available_bytes() -> int:

    return int(psutil.virtual_memory().available)


def memory_figures(device: str) -> dict[str, int]:

    figures = {"host_available_bytes": int(psutil.virtual_memory().available)}
    if device == "cuda":
        import torch  # lazy: torch takes seconds to import

        free, total = torch.cuda.mem_get_info()
        figures.update(gpu_free_bytes=int(free), gpu_total_bytes=int(total),
                       gpu_reserved_bytes=int(torch.cuda.memory_reserved()))
    return figures


@dataclass(frozen=True)
class Shapes:
    obs: int
    act: int
    net_arch: tuple[int, ...]


def replay_buffer_bytes(shapes: Shapes, buffer_size: int, n_envs: int = 1) -> int:
    """SB3's ReplayBuffer: observations and next observations, actions, rewards, dones, timeouts (float32)."""
    return buffer_size * n_envs * (2 * shapes.obs + shapes.act + 3) * FLOAT_BYTES


def batch_bytes(agent: str, batch: int, shapes: Shapes) -> int:
    """A generous estimate of one gradient step's tensors for ``batch`` samples.

    The sampled batch plus each network's activations, counted three times over for the
    forward pass, the gradients and the optimizer's temporaries, for the networks the agent's roster
    row says its gradient step runs (SAC: an actor, two critics and two target critics; PPO and A2C:
    one actor and one critic).
    """
    spec = agent_spec(agent)
    hidden = sum(shapes.net_arch)
    sample = 2 * shapes.obs + shapes.act + 3
    actor = shapes.obs + hidden + 2 * shapes.act
    critic = shapes.obs + shapes.act + hidden + 1
    networks = spec.actors * actor + spec.critics * critic
    return batch * (sample + 3 * networks) * FLOAT_BYTES


@dataclass(frozen=True)
class BatchBackoff:
    """The out-of-memory policy: halve the batch (or, without one, the rollout), never below ``floor``."""

    floor: int

    def next(self, size: int) -> tuple[int, bool]:
        """The size to try next, and whether it changed (False: already at the floor; the stage fails)."""
        new = size // 2
        return (new, True) if new >= self.floor else (size, False)
