"""Data: the BMAD domains and MVFA folder layout, image readers (PIL formats, 16-bit, DICOM, NIfTI), the SIMULATED toy set and feature
simulator, the 2 x 2 mosaic augmentation, and the paper's reported numbers. Names load on first use.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submodules=['bmad', 'domains', 'images', 'medical', 'mosaic', 'reference', 'sim', 'toy'],
    submod_attrs={
        'domains': ['ALIASES', 'DOMAINS', 'MASKED', 'SIMULATED_MARKER', 'SPLITS', 'TASKS', 'canonical_domain'],
        'bmad': ['IMAGE_EXT', 'UNREADABLE', 'ImageDataset', 'Sample', 'holdout', 'list_split', 'load_image', 'preprocess', 'preprocess_array', 'read_image', 'require_both_classes', 'simulated', 'unnormalise'],
        'images': ['image_items'],
        'mosaic': ['Mosaic'],
        'medical': ['MAX_PIXELS', 'MAX_VOXELS', 'Decoded', 'Source', 'UnreadableInput', 'decode', 'expand', 'expand_folder'],
        'toy': ['make_toy_bmad'],
        'sim': ['SimParams', 'simulate'],
    },
)
