import time, os, sys, resource, jax, jax.numpy as jnp, numpy as np
from poolsim import experiments as E, _engine
keys=jax.vmap(jax.random.key)(jnp.arange(10,dtype=jnp.uint32))
tot_w=0; tot_c=0
for name, kw in [("asymptotic",{}),("domain_addition",{}),("symmetric",{})]:
    s,P=E.spec(name, **kw)
    fn=_engine._compiled(s,"float32")
    lo=fn.lower(keys)
    r0=resource.getrusage(resource.RUSAGE_SELF); t=time.time()
    c=lo.compile()
    r1=resource.getrusage(resource.RUSAGE_SELF)
    tot_w+=time.time()-t; tot_c+=(r1.ru_utime-r0.ru_utime)+(r1.ru_stime-r0.ru_stime)
    t=time.time(); out=c(keys); jax.block_until_ready(out); run=time.time()-t
print(os.environ.get("XLA_FLAGS"), "compile wall", round(tot_w,2), "cpu", round(tot_c,2), "last run", round(run,3))
