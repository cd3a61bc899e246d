"""The AWM environment pipeline: scenarios, then per scenario a database (schema and data),
an app (spec and code) and verifiers; ``pipeline`` runs the stages in order. It uses the shared
stage framework at ``synth/`` top and nothing of the persona-world pipeline."""
