# hpctrain's training image for Charliecloud, built by `hpctrain container build` (see README,
# "Containers"): @BASE@ is a Debian 12 root file system made by debootstrap from Debian's
# packages (Python, OpenMPI 4.1 as on the host); the context holds hpctrain's sources and, under
# .build/, the wheels of every dependency at the host venv's versions (torch's CPU build, mpi4py
# built against the same OpenMPI, the host's Horovod wheel). Nothing is fetched: the build works
# offline, as it must at an air-gapped site.
FROM @BASE@
COPY . /opt/hpctrain
RUN HPCTRAIN_VENV=/opt/venv HPCTRAIN_WHEELS=/opt/hpctrain/.build/wheels \
    HPCTRAIN_CACHE=/opt/hpctrain/.build/cache HPCTRAIN_EXTRAS= PYTHON=/usr/bin/python3 \
    bash /opt/hpctrain/scripts/setup.sh && rm -rf /opt/hpctrain/.build /root/.cache
ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin
