"""Runtime install and file push for hosts without internet: wheelhouse, install-runtime, push-model."""
