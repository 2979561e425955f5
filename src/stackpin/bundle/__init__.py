"""Offline bundles for air-gapped sites: export, inspect, verify, load.

A bundle is a directory (optionally packed into one ``.tar``)::

    manifest.json      format version, inputs, images, size + sha256 of every other file
    manifest.sig       ed25519 over the exact bytes of manifest.json (optional)
    SHA256SUMS         the same checksums in ``sha256sum -c`` form, for the site scripts
    images.tar.zst     ONE ``docker save`` stream of every image (shared layers stored once)
    sbom/ dockerfiles/ locks/ reports/ [wheels/] bin/ README.md

Export reads the daemon's save archive once, compressing each layer into a zstd frame of
its own as it arrives (``stream``), then writes the layout's frames in a fixed order into
the file, hashing them: no uncompressed layer touches the disk. Everything is
written into a hidden staging folder beside the target and renamed at the end, so a
killed export leaves nothing at the target and a rerun starts clean.

Verification streams and never extracts: a folder is walked (links, devices and unknown
files refused), an archive is read member by member against an allow-list (regular files
and folders under one top folder; absolute paths, ``..``, links and devices refused).
Nothing reaches Docker before every check has passed.

Determinism (issue 7, item 4): the same images and options give the same bytes. The
save stream's member order is the daemon's lexical walk; its ``manifest.json`` lists
images in Go map order, so it is rewritten sorted. zstd runs multi-threaded at a pinned
level; zstd's multi-threaded format does not depend on the worker count (checked:
threads 1, 2, 4, 8 give identical frames). File order, modes and the archive's headers
are fixed; the only time is ``created``, from the cells' SOURCE_DATE_EPOCH.

The package, one job per module: ``format`` (file names, shared constants, records,
entries and the manifest; imports no other bundle module), ``resolved`` (each image found
once, with the build record and Dockerfile that made it), ``contents`` (every other file
planned as data), ``siteconf`` (the site scripts' data files), ``source`` (what a
``--with-wheels`` rebuild reads), ``models``, ``export`` (the pipeline and its one
writer), ``stream`` (save -> a zstd frame per layer -> layout), ``verify``, ``trust``, ``load``
and ``secrets``. Import the module you need, e.g.
``from stackpin.bundle import verify`` then ``verify.verify(source)``.
"""
