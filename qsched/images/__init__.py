"""Images: what a boot's image asks of its host (traits, min_ram, min_disk).

:mod:`~qsched.images.base` holds the interface and the opaque default (image ids
accepted as given, nothing asked); :mod:`~qsched.images.glance` looks images up in
Glance. The interface sits with the vocabulary (the front door and cells name it);
the Glance backend with the other backends, above it.
"""
