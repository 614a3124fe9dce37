"""Where models come from: the `Source` protocol and the kinds behind it.

`protocol` (the interface the plane holds: list, read, capture, watch, settle), `local` (a model
repository directory), `s3` (an s3:// prefix) over `objectstore` (the S3 client), and the local
source's watching: `inotify` (the watcher thread), `watchmode` (inotify or polling, and why),
`poller` (signature polling). `recorded` is what the registry remembers of each model's source.
Import the module you need (`from controlplane.source.protocol import Source`).
"""
