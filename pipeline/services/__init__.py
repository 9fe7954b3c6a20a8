"""What the stages and commands share: the build cache, subprocesses, progress display, folder
layout and output folders, the manifest, the wheel template, the local index and the CI matrix."""
