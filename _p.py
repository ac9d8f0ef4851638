import os, time, sys, resource
os.environ["XLA_FLAGS"]="--xla_backend_optimization_level=0"
from poolsim.figures import _data, load, FIGURES
jobs=[j for n in FIGURES for j in load(n).SIMULATIONS]
t=time.time(); _data.prefetch(jobs, seeds=10, workers=int(sys.argv[1])); r=resource.getrusage(resource.RUSAGE_SELF)
print("workers", sys.argv[1], "prefetch wall", round(time.time()-t,2), "cpu", round(r.ru_utime+r.ru_stime,2))
