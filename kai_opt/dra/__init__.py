"""Dynamic Resource Allocation: CEL selectors, devices as resource columns, device choice for claims."""
