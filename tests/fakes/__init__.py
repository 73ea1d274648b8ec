"""In-memory stand-ins for the real APIs (Kubernetes, Slurm, Docker, the accounting database), for
unit tests only: this package lives under tests/ so it never ships in the product or its images.
Each fake that stands for a real API is checked against the real one in an integration or e2e test
(see docs/testing.md)."""
