"""Hardware profiles: YAML files describing how to run a model on a kind of host.

Public API: load_profile, list_profiles, Profile, ProfileError, METHODS (the one table
of speculative methods and their capabilities), RUNTIMES (runtime -> launch flags).
"""

from ddops.profile.loader import ProfileError, list_profiles, load_profile, profile_file, profiles_dir
from ddops.profile.methods import METHODS, Method, method_for
from ddops.profile.runtimes import RUNTIMES, Runtime
from ddops.profile.schema import Profile
from ddops.profile.yamlfile import ConfigError

__all__ = [
    "METHODS", "RUNTIMES", "ConfigError", "Method", "Profile", "ProfileError", "Runtime",
    "list_profiles", "load_profile", "method_for", "profile_file", "profiles_dir",
]
