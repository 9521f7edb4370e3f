"""hpctrain as Hydra launchers: `hydra/launcher=hpctrain_local` and `hydra/launcher=hpctrain_slurm`
run every point of a `-m` sweep of any `@hydra.main` app as one distributed hpctrain run (config.py
for the settings, launcher.py for the launch side, rank.py for what every rank runs)."""
