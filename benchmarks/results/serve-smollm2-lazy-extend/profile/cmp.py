import collections
def load(f):
    for line in open(f):
        stack,_,n=line.rstrip().rpartition(' ')
        yield [fr.strip().split(' ')[0] for fr in stack.split(';')], int(n)
def prof(f, root, excl):
    c=collections.Counter(); mlp=0
    for names,n in load(f):
        if root not in names or any(e in names for e in excl): continue
        i=names.index(root)
        for k in set(names[i:]): c[k]+=n
        if 'LlamaMLP.forward' in names[i:]: mlp+=n
    return c, mlp
a,ma=prof('echo-cost.raw','run_eagle_verify',['EAGLEWorkerV2._forward_prefill_batch'])
b,mb=prof('none.raw','Scheduler.run_batch',['EagerRunner._execute_extend'])
keys=set(k for k,v in a.items() if v/ma>0.02)|set(k for k,v in b.items() if v/mb>0.02)
rows=sorted(keys,key=lambda k:-(a[k]/ma))
for k in rows: print(f"{k:60s} echo {a[k]/ma:6.3f}  none {b[k]/mb:6.3f}")
