"""The panels' answer sender: the piece of page script every protocol's answer form uses (the
Beauty Index judge's page, tasks/beauty/panel.py; VAB's expert page, tasks/vab/panel.py), so
that an answer the server did not take is kept and sent again the same way everywhere (issue 26
item 1). A protocol puts :data:`SEND_ANSWER_JS` in front of its own script and calls
``panelSendAnswer(form, body, next)`` from its form's submit handler, once per page.

The answer is sent by fetch and kept until the server has it: a busy server (503), a proxy with
no server behind it (502, 504) or no connection at all gets the same form again, after 1, 2, 4,
then every 8 s, while the page says "Saving... (the server did not take it yet: trying again)"
(``#saving``, a status line after the form). Recorded (the server's 303): the browser goes to
``next``. Refused for good (a closed study, an ended session, an answer the server rejects): its
page replaces this one and nothing is sent again. Each store keys an answer by judge and
position, so an answer sent twice is recorded once.
"""

SEND_ANSWER_JS = """function panelSendAnswer(form,body,next){
var saving=null;
function say(text){ if(!saving){ saving=document.createElement('p'); saving.id='saving'; saving.setAttribute('role','status');
  form.parentNode.insertBefore(saving,form.nextSibling); } saving.textContent=text; }
function send(tries){
  say(tries?'Saving... (the server did not take it yet: trying again)':'Saving...');
  fetch(form.action,{method:'POST',body:body,credentials:'same-origin',redirect:'manual',
                     headers:{'Content-Type':'application/x-www-form-urlencoded'}})
    .then(function(r){
      if(r.type==='opaqueredirect'){ location.assign(next); return; }  // recorded: the next item
      if(r.status===502||r.status===503||r.status===504){ later(tries); return; }
      return r.text().then(function(t){  // refused for good (session ended, study closed...): its page
        var doc=new DOMParser().parseFromString(t,'text/html'); document.title=doc.title||document.title;
        document.body.innerHTML=doc.body?doc.body.innerHTML:t; }); },
      function(){ later(tries); }); }
function later(tries){ setTimeout(function(){ send(tries+1); },Math.min(1000*Math.pow(2,tries),8000)); }
send(0);
}
"""
