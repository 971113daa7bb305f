"""KAI-Scheduler's default PriorityClasses and its preemptibility threshold, apart from the API models (no pydantic):
the manifests create those classes, and rendering them should not import the models."""

# KAI-Scheduler's defaults: priority < 100 is preemptible unless the PodGroup says otherwise.
DEFAULT_PRIORITY_CLASSES = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
NON_PREEMPTIBLE_PRIORITY = 100
