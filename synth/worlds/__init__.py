"""The persona-world pipeline: personas and their bibles, plans, the setup day, each day
implemented with the tool library, validated and reviewed, the skills learned, exploration
and task synthesis. It uses the shared stage framework at ``synth/`` top; from the
environment pipeline it takes the app smoke check (``appgen``) and the verifier gate's
feedback (``verifiers``), so a library app and a task verifier pass the same gates as an
AWM environment's."""
