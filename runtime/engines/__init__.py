"""Engine implementations of the ``talaria.runtime.engine.Engine`` seam."""
