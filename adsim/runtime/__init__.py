"""Run-time services below everything else: run-folder I/O, device and precision, torch.distributed,
the compiled-program cache, code kept out of compiled graphs.

Names load on first use (``lazy_loader``), so importing this package costs nothing.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['compile_cache', 'device', 'distributed', 'eager', 'files', 'io'],
    submod_attrs={
        'files': ['check_writable', 'os_error_line', 'remove_stale_temporaries'],
        'io': ['UnsafeCheckpointError', 'convert_checkpoint', 'load_torch', 'plain', 'read_json', 'save_torch', 'write_json'],
        'device': ['PRECISIONS', 'autocast_dtype', 'device_name', 'resolve_device'],
        'eager': ['outside_graphs'],
    },
)
