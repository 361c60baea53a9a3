"""A package, so that pytest (default import mode) names these test modules drafts.test_base,
drafts.test_registry, ...: their basenames are other folders' too (tasks/test_base.py)."""
