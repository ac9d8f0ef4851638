import time, os, sys, jax, jax.numpy as jnp, numpy as np
from poolsim import experiments as E, _engine
name=sys.argv[1]
s,P=E.spec(name)
fn=_engine._compiled(s,"float32")
keys=jax.vmap(jax.random.key)(jnp.arange(10,dtype=jnp.uint32))
t=time.time(); lo=fn.lower(keys); t1=time.time(); 
txt=lo.as_text(); print("stablehlo lines", txt.count("\n"))
c=lo.compile(); t2=time.time()
print(name, os.environ.get("XLA_FLAGS"), "lower",round(t1-t,2),"compile",round(t2-t1,2))
t=time.time(); out=c(keys); jax.block_until_ready(out); print("run", time.time()-t)
