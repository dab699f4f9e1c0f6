"""The training engine: device, precision, optimizer, clipping and the generic loop.

Rooms (private: import their public names from this door):
- `_clipping`: Gradient-norm clipping: one definition, torch.nn.utils.clip_grad_norm_'s, in three scopes.
- `_fabric`: The training engine: where training runs, and the one optimizer of every loop.
- `_loop`: The generic training loop: one module, one loss, one optimizer, driven by Lightning Fabric.
- `_memory`: How much a batched fit may hold on the training device, and how data crosses between host and device.
"""

from __future__ import annotations

from walla.cli.lazy import door

_ROOMS = {
    "_clipping": ("SliceClip", "clip_grad_norms_", "clip_gradients", "scale_slices_", "slice_clip_coefs"),
    "_fabric": (
        "TrainEnv",
        "gemm_flops",
        "init_device",
        "init_generator",
        "linear_init_",
        "load_checkpoint",
        "make_fabric",
        "make_optimizer",
        "resolve_device",
        "resolve_precision",
        "row_batches",
        "save_checkpoint",
        "seeded",
    ),
    "_loop": ("fit_module",),
    "_memory": (
        "DEVICE_MEMORY_SHARE",
        "HostRead",
        "PARAM_BUDGET_BYTES",
        "free_device_bytes",
        "seeds_per_chunk",
        "to_device",
        "to_host",
    ),
}
__getattr__, __all__ = door(__name__, _ROOMS)
