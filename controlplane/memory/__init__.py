"""GPU and host memory: what a load costs and who may hold a model loaded.

`budget` (admit, evict idle models), `footprint` (measured memory per load), `leases` (on-demand
leases that expire), `ondemand` (loading a model on demand and unloading it when idle).
"""
