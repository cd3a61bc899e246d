"""synth/: world and task synthesis, and its QA.

Two rooms around a shared stage framework:

* ``synth.environments``: the AWM environment pipeline (scenarios, database, app, verifiers);
* ``synth.worlds``: the persona-world pipeline (personas, plans, days, the tool library,
  day validation and review, skills, exploration, tasks);
* shared at this level: ``stage`` (a stage, its context and budget), ``prompts`` (+
  ``prompts/``), ``errors``, ``seeds/``, and ``runs`` (a synthesis run on disk, which drives
  either pipeline).
"""
