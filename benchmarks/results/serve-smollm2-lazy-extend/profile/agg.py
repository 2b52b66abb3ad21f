import collections,sys
f=sys.argv[1]; root=sys.argv[2] if len(sys.argv)>2 else 'Scheduler.run_batch'
tot=0; incl=collections.Counter()
for line in open(f):
    stack,_,n=line.rstrip().rpartition(' ')
    n=int(n)
    names=[fr.strip().split(' ')[0] for fr in stack.split(';')]
    if root not in names: continue
    tot+=n
    for name in set(names[names.index(root):]): incl[name]+=n
print('root samples',tot)
for k,v in incl.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 70): print(f"{k:60s} {v/tot*100:6.1f}%")
