"""Settings: the one typed schema (config.yaml + --set + flags merged into one validated object).

    keys.py          key(): a field with its help text, bounds and choices; coercion; name=weight mixes
    schema.py        the sections (run, model, tiers, cache, workload, schedule, trace, rag, profiles)
    load.py          walking the schema; reading, merging and validating config file, --set and flags
    load_control.py  the sections of load control (QoS, autoscaler, roles) and semantic reuse
    doc.py           config.yaml and the settings reference, rendered from the schema

A shared leaf: every stage may read settings; this package imports nothing of the stages.
"""

from kv_cache.config.keys import PREFIXED_SECTIONS, coerce, flag_name, is_flag_key, key, parse_mix
from kv_cache.config.load import default_dict, iter_keys, read_config_file, replace, resolve
from kv_cache.config.load_control import (
    QOS_CLASSES,
    SEMANTIC_MIX,
    AutoscaleSettings,
    QosClass,
    QosSettings,
    RoleSettings,
    SemanticSettings,
)
from kv_cache.config.schema import (
    REPO_CONFIG,
    CacheSettings,
    ModelSettings,
    Profile,
    ProfileSettings,
    RagSettings,
    RunSettings,
    ScheduleSettings,
    Settings,
    TierSettings,
    TraceSettings,
    WorkloadSettings,
)

__all__ = [
    "QOS_CLASSES", "SEMANTIC_MIX", "PREFIXED_SECTIONS", "REPO_CONFIG", "AutoscaleSettings", "CacheSettings",
    "ModelSettings", "Profile", "ProfileSettings", "QosClass", "QosSettings", "RagSettings", "RoleSettings",
    "RunSettings", "ScheduleSettings", "SemanticSettings", "Settings", "TierSettings", "TraceSettings",
    "WorkloadSettings", "coerce", "default_dict", "flag_name", "is_flag_key", "iter_keys", "key", "parse_mix",
    "read_config_file", "replace", "resolve",
]
