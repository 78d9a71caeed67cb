"""What the demo driver (demo/driver.py) runs the shop with: processes,
a PostgreSQL cluster of its own, and the faults it injects (CPU cgroup,
CPU hog, disk flood, network namespaces with a rate-limited veth). Every
resource is registered on a `Cleanup` stack as soon as it exists, so it is
undone on success, error, SIGINT and SIGTERM."""
